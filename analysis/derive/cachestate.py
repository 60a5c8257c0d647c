"""The prefix cache a step should have seen, against what the server reported.

A run with shared prefixes (`--prefix-groups G --prefix-tokens P`, or
`--shared-prefix-tokens P`: one group) implies, once the engine holds every prefix, that
each request finds its prefix's full blocks cached:

    implied = B × min(⌊P / B⌋, ⌊(prompt_tokens − 1) / B⌋)

with B the engine's block size (`--engine-block-size`, the manifest's
`config.engine_block_size`, 16 when absent) and `prompt_tokens` the server's count (an engine
always computes the last prompt token). `cached_implied_pct` = 100 × Σ implied / Σ
prompt_tokens over the same requests as `cached_tokens_pct`. It is a lower bound on a real
engine whose chat template puts tokens before the user's text (they are shared too, and
shift the blocks); the simulator adds none, so there it is exact once every prefix was seen.

The step's cache phase (`--cache-phase`, locustfiles/master/cachephase.py) comes from the
manifest's step entry: `cache_phase`, `cache_flush` (ok | refused | failed) and
`cache_primed`. Warnings: the engine refused the flush (the fix named), a prefix was not
primed, and reported and implied differ by more than IMPLIED_TOLERANCE_PCT points.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pandas as pd

from analysis.derive.parts import GroupView, Part, RowPart, RunView
from analysis.derive.sessions import cached_tokens_pct, cached_tokens_warning

IMPLIED_TOLERANCE_PCT: Final = 5.0
"""Reported and implied cached shares further apart than this (percentage points) earn a
warning: about one block of 16 in a prompt of 320 tokens."""

DEFAULT_BLOCK_SIZE: Final = 16
NOT_BUILT: Final = ("dataset:", "conversations:", "trace:")
"""Workloads whose prompts llmload did not build from the prefixes: no implied share."""


@dataclass(frozen=True)
class PrefixPlan:
    """The run's shared prefixes: G groups of P tokens, the engine's block size B."""

    groups: int
    tokens: int
    block_size: int

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> PrefixPlan | None:
        """The plan the manifest's config records (None: no shared prefix)."""
        config = manifest.get("config") or {}
        if str(config.get("workload") or "").startswith(NOT_BUILT):
            return None
        tokens = int(config.get("prefix_tokens") or config.get("shared_prefix_tokens") or 0)
        groups = int(config.get("prefix_groups") or (1 if tokens else 0))
        block = int(config.get("engine_block_size") or DEFAULT_BLOCK_SIZE)
        return cls(groups, tokens, block) if groups and tokens else None

    def implied_tokens(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """Cached tokens each prompt implies with its prefix in the cache (NaN stays NaN)."""
        b = self.block_size
        last = np.floor((prompt_tokens - 1) / b)
        return b * np.clip(np.minimum(self.tokens // b, last), 0, None)


def cache_columns(
    plan: PrefixPlan | None,
    requests: pd.DataFrame,
    rows: np.ndarray,
    step_entry: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A group's cache columns. `rows`: its successful requests; `step_entry`: its manifest
    step (None for the cold group)."""
    phase = (step_entry or {}).get("cache_phase") or {}
    out: dict[str, Any] = {
        "cached_implied_pct": float("nan"),
        "cache_phase": phase.get("phase"),
        "cache_flush": phase.get("flush"),
        "cache_primed": phase.get("primed") if "prime" in str(phase.get("phase")) else None,
    }
    if plan is None or "prompt_tokens" not in requests:
        return out
    prompt = pd.to_numeric(requests["prompt_tokens"], errors="coerce").to_numpy(np.float64)
    use = rows & ~np.isnan(prompt)
    if "cached_tokens" in requests:
        cached = pd.to_numeric(requests["cached_tokens"], errors="coerce").to_numpy(np.float64)
        if (use & ~np.isnan(cached)).any():  # the same requests as cached_tokens_pct
            use &= ~np.isnan(cached)
    total = float(prompt[use].sum())
    if total > 0:
        out["cached_implied_pct"] = 100.0 * float(plan.implied_tokens(prompt[use]).sum()) / total
    return out


def cache_warnings(
    name: str, row: Mapping[str, Any], step_entry: Mapping[str, Any] | None
) -> list[str]:
    """What a step's cache phase and cached share say that a reader must know."""
    out: list[str] = []
    phase = (step_entry or {}).get("cache_phase") or {}
    if phase.get("flush") in ("refused", "failed"):
        out.append(
            f"{name}: the engine's prefix cache was not flushed before the step "
            f"({phase.get('flush_detail') or phase.get('flush')}): the step did not start "
            "cold; vLLM serves POST /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1 in "
            "its environment, SGLang serves POST /flush_cache"
        )
    failed = int(phase.get("prime_failed") or 0)
    if failed:
        out.append(
            f"{name}: {failed} of {int(phase.get('primed') or 0) + failed} shared prefixes "
            "were not primed before the step (see the manifest's cache_prime probes)"
        )
    implied, reported = (
        _number(row.get("cached_implied_pct")),
        _number(row.get("cached_tokens_pct")),
    )
    if (
        implied is not None
        and reported is not None
        and abs(reported - implied) > IMPLIED_TOLERANCE_PCT
    ):
        out.append(
            f"{name}: the server reported {reported:.1f}% of prompt tokens cached where the "
            f"shared prefixes imply {implied:.1f}% (more than {IMPLIED_TOLERANCE_PCT:g} points "
            "apart): the prefixes were evicted or not yet cached (a flush without priming), "
            "the engine's block size is not --engine-block-size, or its prefix caching is off"
        )
    return out


def step_entry(manifest: Mapping[str, Any], step: int | None) -> Mapping[str, Any] | None:
    """The manifest's timeline entry of `step` (None: the cold group, or not there)."""
    if step is None:
        return None
    for entry in manifest.get("steps") or []:
        if isinstance(entry, Mapping) and entry.get("step") == step:
            return entry
    return None


def _number(value: Any) -> float | None:
    """A known number (None for None and NaN)."""
    if isinstance(value, int | float) and not np.isnan(value):
        return float(value)
    return None


@dataclass(frozen=True)
class Cache(Part):
    """The prefix cache's part of the summary rows: the cached share the server reported,
    the share the shared prefixes imply, and the cache phase before each step."""

    requests: pd.DataFrame
    ok: np.ndarray
    plan: PrefixPlan | None

    @classmethod
    def make(cls, view: RunView) -> Cache:
        return cls(view.run.requests, view.ok, PrefixPlan.of(view.run.manifest))

    def columns(self, group: GroupView) -> dict[str, Any]:
        latency = group.latency
        return {
            "cached_tokens_pct": cached_tokens_pct(self.requests, latency),
            **cache_columns(self.plan, self.requests, latency, group.step_entry),
        }

    def warnings(self, name: str, row: Mapping[str, Any], group: GroupView) -> list[str]:
        return cache_warnings(name, row, group.step_entry) if row["group"] == "step" else []

    def run_warnings(self) -> list[str]:
        return cached_tokens_warning(self.requests, self.ok)


ROW_PART: Final = RowPart("prefix cache", Cache.make)
