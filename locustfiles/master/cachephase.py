"""The cache phase before each step (`--cache-phase`): the engine's prefix cache in a known
state when the step's users start.

    phase = CachePhase(options, host, model=lambda: target_model, note=coordinator.add_probes)
    entry["cache_phase"] = phase.run(step)     # the step's timeline entry (the manifest)

- flush: one POST to the engine's route that empties its prefix cache: vLLM's
  `/reset_prefix_cache` (served only when vLLM runs with `VLLM_SERVER_DEV_MODE=1`; 404
  without), then, when that route is not there (404, 405), SGLang's `/flush_cache`.
- prime (after the flush): each shared prefix (`--prefix-groups`, `--shared-prefix-tokens`)
  sent once, one after the other, each answered before the next: the prefix then PRIME_TAIL
  pieces, `max_tokens` 1, not streamed. An engine caches the prefix's full blocks.

Every request is a probe (the manifest's `probes`, purposes `cache_flush` and
`cache_prime`), never a request row: nothing of it counts in a step. The outcome goes into
the step's timeline entry as `cache_phase` (CachePhaseRecord). The cold phase gets none: it
measures the engine as it is found. Between two steps the previous step's users keep
sending while the phase runs (Locust changes the user count, it does not stop the users), so
from step 1 on the state is the phase's plus what those requests add.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

from locustfiles.options.options import ChatOptions
from locustfiles.request.client import new_pool
from locustfiles.request.tokenizer import load_tokenizer
from locustfiles.run.body import request_body
from locustfiles.run.manifest import ProbeRecord
from locustfiles.run.probe import send_probe
from locustfiles.traffic.prompts import PromptBuilder

log = logging.getLogger("llmload.master")

FLUSH_ROUTES: Final = ("/reset_prefix_cache", "/flush_cache")
"""vLLM's (dev mode) then SGLang's; the next is tried when a route is not there."""

NOT_THERE: Final = (404, 405)
PRIME_TAIL: Final = 4
"""Pieces after the prefix in a priming prompt (the engine always computes the last prompt
token: the prefix's own blocks are then all full and cached)."""


@dataclass(frozen=True)
class CachePhaseRecord:
    """What the cache phase before one step did (the manifest's step `cache_phase`).

    `flush`: "ok", "refused" (every route answered an HTTP error: `flush_detail` says which)
    or "failed" (no answer); None when the phase does not flush. `primed` / `prime_failed`:
    prefixes whose priming request succeeded / did not (0 when the phase does not prime)."""

    phase: str
    flush: str | None = None
    flush_route: str | None = None  # the route that answered 200
    flush_detail: str = ""
    primed: int = 0
    prime_failed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CachePhase:
    """Flushes and primes the target's prefix cache before each step (module docstring)."""

    def __init__(
        self,
        options: ChatOptions,
        host: str,
        model: Callable[[], str | None],
        note: Callable[[list[ProbeRecord]], None],
    ) -> None:
        self.options = options
        self.base = host.rstrip("/")
        self.model = model
        self.note = note
        self._prompts: PromptBuilder | None = None

    @property
    def active(self) -> bool:
        return self.options.cache_phase != "none" and bool(self.base)

    def run(self, step: int) -> dict[str, Any] | None:
        """The phase before `step` (None: no phase); never raises for the target's sake."""
        if not self.active:
            return None
        phase = self.options.cache_phase
        pool = new_pool()
        probes: list[ProbeRecord] = []
        try:
            flush: tuple[str | None, str | None, str] = (None, None, "")
            if "flush" in phase:
                flush = self._flush(pool, probes)
            primed = failed = 0
            if "prime" in phase:
                primed, failed = self._prime(pool, probes, step)
        finally:
            pool.clear()
            self.note(probes)
        record = CachePhaseRecord(phase, flush[0], flush[1], flush[2], primed, failed)
        if record.flush in ("refused", "failed"):
            log.warning("llmload: step %d: the prefix cache was not flushed (%s); for vLLM "
                        "start the server with VLLM_SERVER_DEV_MODE=1", step,
                        record.flush_detail)  # fmt: skip
        if failed:
            log.warning("llmload: step %d: %d of %d prefixes were not primed", step, failed,
                        primed + failed)  # fmt: skip
        return record.to_dict()

    def _flush(self, pool: Any, probes: list[ProbeRecord]) -> tuple[str | None, str | None, str]:
        said: list[str] = []
        outcome = "failed"
        for route in FLUSH_ROUTES:
            sent = send_probe(pool, "cache_flush", "POST", self.base + route,
                              api_key=self.options.api_key())  # fmt: skip
            probes.append(sent.record)
            said.append(f"POST {route}: {sent.record.outcome}")
            if sent.record.outcome == "ok":
                return "ok", route, "; ".join(said)
            if sent.reply.status is not None:
                outcome = "refused"
            if sent.reply.status not in NOT_THERE:
                break  # the route is there and said no (or no answer): another would not help
        return outcome, None, "; ".join(said)

    def _prime(self, pool: Any, probes: list[ProbeRecord], step: int) -> tuple[int, int]:
        prompts = self.prompts()
        rng = random.Random(f"llmload-prime:{self.options.seed}:{step}")
        primed = failed = 0
        for group in range(len(prompts.prefixes)):
            text = prompts.prime_text(group, PRIME_TAIL, rng)
            body = request_body(self.options, self.options.model or self.model(), text, None, 1,
                                stream=False, continuous_usage=False, ignore_eos=False)  # fmt: skip
            sent = send_probe(pool, "cache_prime", "POST", self.base + self.options.path,
                              body=body, api_key=self.options.api_key())  # fmt: skip
            probes.append(sent.record)
            if sent.record.outcome == "ok":
                primed += 1
            else:
                failed += 1
        return primed, failed

    def prompts(self) -> PromptBuilder:
        """The workers' prefixes: the same seed, tokenizer and groups (built once)."""
        if self._prompts is None:
            o = self.options
            counter = load_tokenizer(o.tokenizer) if o.tokenizer else None
            self._prompts = PromptBuilder(o.seed, counter, o.prefix_tokens, o.prefix_groups)
        return self._prompts
