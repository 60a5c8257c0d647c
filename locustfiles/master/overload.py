"""When a staircase should stop climbing: the server is overloaded or saturated (`--stop-when`).

    rule = OverloadRule(ttft_factor=2.0, min_growth=0.10, overload_rate=0.01)
    figures = step_figures(step=5, level=16, stats=group, elapsed_s=30.2)  # live.GroupStats
    reason = rule.verdict(figures, earlier)   # None: go on; else why the staircase stops

A step trips the rule when either holds:

- **server overloaded**: more than `overload_rate` of its finished requests failed as a
  queue rejection (429/503, error kind `queue_rejected`) or a timeout (`ttft_timeout`,
  `stall_timeout`, `total_timeout`): the report's `server-overloaded` verdict
  (analysis/judge/verdict.py), judged live;
- **throughput flat, TTFT grew**: its output-token throughput is below (1 + `min_growth`) ×
  that of the earlier step with the highest throughput (the reference), while its TTFT p50
  is more than `ttft_factor` × the reference's. Past saturation more load only queues:
  the same tokens per second, longer waits for the first token.

Throughput is output tokens per second of the step's run time (the live statistics hold
every finished request of the step, the warmup included); where a step has no token counts
it is ok requests per second instead. A step without the figures a check needs (no
finished request, no TTFT) does not trip that check. Plain data in, text out: no Locust.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from analysis.kernel.schema import (
    OVERLOAD_KINDS,  # error kinds that say the server could not keep up
)


@dataclass(frozen=True)
class StepFigures:
    """What the rule reads of one step: None where the step has no such figure."""

    step: int
    level: float
    finished: int  # requests that ended ok or failed
    overloaded: int  # of those: queue rejections and timeouts (OVERLOAD_KINDS)
    tokens_per_s: float | None  # output tokens per second of the step's run time
    requests_per_s: float | None  # ok requests per second
    ttft_p50_s: float | None


def step_figures(step: int, level: float, stats: Any, elapsed_s: float | None) -> StepFigures:
    """A step's figures from its live statistics (a live.GroupStats, or None: no data)."""
    if stats is None:
        return StepFigures(step, level, 0, 0, None, None, None)
    errors = stats.errors()
    ok = stats.count("ok")
    finished = ok + stats.count("error")
    overloaded = sum(errors.get(kind, 0) for kind in OVERLOAD_KINDS)
    seconds = elapsed_s if elapsed_s is not None and elapsed_s > 0 else None
    tokens = int(stats.output_tokens or 0)
    sketch = stats.sketches.get("ttft")
    ttft = sketch.quantile(0.5) if sketch is not None and sketch.count > 0 else None
    return StepFigures(
        step=step,
        level=level,
        finished=finished,
        overloaded=overloaded,
        tokens_per_s=tokens / seconds if seconds and tokens > 0 else None,
        requests_per_s=ok / seconds if seconds and ok > 0 else None,
        ttft_p50_s=None if ttft is None else float(ttft),
    )


@dataclass(frozen=True)
class OverloadRule:
    """The thresholds (--stop-ttft-factor, --stop-min-growth, --stop-overload-rate)."""

    ttft_factor: float = 2.0
    min_growth: float = 0.10
    overload_rate: float = 0.01

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def verdict(self, step: StepFigures, earlier: Sequence[StepFigures]) -> str | None:
        """Why the staircase stops after `step` (None: it goes on); `earlier`: the steps
        before it, the references of "flat"."""
        return self._overloaded(step) or self._flat(step, earlier)

    def _overloaded(self, step: StepFigures) -> str | None:
        if step.finished <= 0:
            return None
        share = step.overloaded / step.finished
        if step.overloaded == 0 or share <= self.overload_rate:
            return None
        return (f"server overloaded: {share:.1%} of requests rejected (429/503) or timed out "
                f"({step.overloaded} of {step.finished})")  # fmt: skip

    def _flat(self, step: StepFigures, earlier: Sequence[StepFigures]) -> str | None:
        if step.ttft_p50_s is None:
            return None
        # tokens/s where this step and every candidate have it, else requests/s
        use_tokens = step.tokens_per_s is not None and all(
            e.tokens_per_s is not None for e in earlier if e.requests_per_s is not None
        )
        unit = "tokens/s" if use_tokens else "requests/s"

        def rate(f: StepFigures) -> float | None:
            return f.tokens_per_s if use_tokens else f.requests_per_s

        candidates = [e for e in earlier if rate(e) is not None]
        if not candidates:
            return None
        ref = max(candidates, key=lambda e: rate(e) or 0.0)
        best, now = rate(ref), rate(step)
        if best is None or best <= 0 or ref.ttft_p50_s is None or ref.ttft_p50_s <= 0:
            return None
        growth = (now or 0.0) / best - 1
        if growth >= self.min_growth:
            return None
        ttft_growth = step.ttft_p50_s / ref.ttft_p50_s
        if ttft_growth <= self.ttft_factor:
            return None
        return (f"throughput flat ({growth:+.0%} {unit} over step {ref.step}), "
                f"TTFT p50 ×{ttft_growth:.1f}")  # fmt: skip


__all__ = ["OverloadRule", "StepFigures", "step_figures"]
