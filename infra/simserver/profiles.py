"""Engine profiles: named parameter sets for the batching model (see docs/simserver.md).

Only `tiny` is meant for tests and benchmarks; the others are *illustrative* shapes with
plausible orders of magnitude, not measurements of any real engine or GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from analysis.kernel.errors import UsageError
from infra.simserver.dist import IntDist

# Step-time fields (seconds) and the `llmload sim` flag that sets each, with its unit.
TIME_FLAGS = {
    "prefill_per_token": ("--prefill-per-token-us", 1e-6),
    "decode_base": ("--decode-base-ms", 1e-3),
    "decode_per_seq": ("--decode-per-seq-us", 1e-6),
    "decode_per_kv_token": ("--decode-per-kv-token-ns", 1e-9),
}


@dataclass(frozen=True)
class EngineProfile:
    """Parameters of the continuous-batching model. Durations are in seconds."""

    name: str
    description: str
    max_num_seqs: int  # running sequences at most (the batch)
    kv_cache_tokens: int  # KV budget; a sequence reserves prompt + max_tokens on admission
    max_model_len: int  # prompt + max_tokens must fit
    max_num_batched_tokens: int  # prefill tokens + decode sequences admitted into one step
    max_waiting: int  # waiting-queue capacity; beyond it requests are rejected (429/503)
    prefill_per_token: float  # compute-bound prefill: time per prompt token in a step
    decode_base: float  # memory-bound decode: time of a step with a batch of one
    decode_per_seq: float  # extra step time per running sequence
    decode_per_kv_token: float  # extra step time per KV token read (context of the batch)
    output_len: IntDist  # sampled output length unless ignore_eos

    def step_time(self, decode_seqs: int, context_tokens: int, prefill_tokens: int) -> float:
        """Duration of one engine step (before the time scale is applied)."""
        decode = 0.0
        if decode_seqs:
            decode = (
                self.decode_base
                + self.decode_per_seq * decode_seqs
                + self.decode_per_kv_token * context_tokens
            )
        prefill = self.prefill_per_token * prefill_tokens
        if prefill and not decode:
            prefill += self.decode_base  # a prefill-only step still reads the weights once
        return decode + prefill

    def with_overrides(self, **overrides: Any) -> EngineProfile:
        """A copy with the given non-None fields replaced; checks the result."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise UsageError(f"unknown profile field(s): {', '.join(sorted(unknown))}")
        changed = replace(self, **{k: v for k, v in overrides.items() if v is not None})
        changed.check()
        return changed

    def check(self) -> None:
        """Refuse values that cannot be right, named by their `llmload sim` flag."""
        for name in ("max_num_seqs", "kv_cache_tokens", "max_model_len", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')} must be >= 1, not {getattr(self, name)}"
                )
        if self.max_waiting < 0:
            raise UsageError(f"--max-waiting must be >= 0, not {self.max_waiting}")
        for name, (flag, unit) in TIME_FLAGS.items():
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{flag} must be >= 0, not {value / unit:g}")
        if self.decode_base <= 0 and self.decode_per_seq <= 0:
            raise UsageError("--decode-base-ms or --decode-per-seq-us must be > 0")
        if self.kv_cache_tokens < self.max_model_len:
            raise UsageError(
                f"kv-cache-tokens ({self.kv_cache_tokens}) must hold one max-model-len "
                f"sequence ({self.max_model_len})"
            )


_MS = 1e-3
_US = 1e-6

PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        EngineProfile(
            name="tiny",
            description="fast, for tests, demos and benchmarks (ms-level steps, huge batch)",
            max_num_seqs=8192,
            kv_cache_tokens=16_000_000,
            max_model_len=8192,
            max_num_batched_tokens=65536,
            max_waiting=65536,
            prefill_per_token=2 * _US,
            decode_base=1 * _MS,
            decode_per_seq=2 * _US,
            decode_per_kv_token=0.0,
            output_len=IntDist(16, 128),
        ),
        EngineProfile(
            name="8b-1gpu",
            description="illustrative: an 8B dense model on one large GPU",
            max_num_seqs=256,
            kv_cache_tokens=400_000,
            max_model_len=8192,
            max_num_batched_tokens=8192,
            max_waiting=4096,
            prefill_per_token=60 * _US,
            decode_base=7 * _MS,
            decode_per_seq=40 * _US,
            decode_per_kv_token=0.01 * _US,
            output_len=IntDist(64, 512),
        ),
        EngineProfile(
            name="70b-4gpu",
            description="illustrative: a 70B dense model, tensor-parallel over four GPUs",
            max_num_seqs=256,
            kv_cache_tokens=800_000,
            max_model_len=16384,
            max_num_batched_tokens=8192,
            max_waiting=4096,
            prefill_per_token=200 * _US,
            decode_base=22 * _MS,
            decode_per_seq=120 * _US,
            decode_per_kv_token=0.02 * _US,
            output_len=IntDist(64, 512),
        ),
        EngineProfile(
            name="small-cpu",
            description="illustrative: a small model served on CPU (slow prefill, small batch)",
            max_num_seqs=8,
            kv_cache_tokens=65536,
            max_model_len=4096,
            max_num_batched_tokens=4096,
            max_waiting=256,
            prefill_per_token=400 * _US,
            decode_base=40 * _MS,
            decode_per_seq=5 * _MS,
            decode_per_kv_token=0.0,
            output_len=IntDist(32, 256),
        ),
    )
}


def get_profile(name: str) -> EngineProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(f"unknown profile {name!r} (choose from: {', '.join(PROFILES)})") from None
