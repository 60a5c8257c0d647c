"""Fault injection: per-request faults drawn at configured rates (see docs/simserver.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from analysis.kernel.errors import UsageError

RATE_FLAGS = {
    "error_rate": "--fault-500-rate",
    "drop_rate": "--fault-drop-rate",
    "malformed_rate": "--fault-malformed-rate",
    "stall_rate": "--fault-stall-rate",
    "slow_header_rate": "--fault-slow-header-rate",
}


@dataclass(frozen=True)
class FaultConfig:
    """Rates are probabilities per request, in [0, 1]."""

    error_rate: float = 0.0  # HTTP 500 before any streaming
    drop_rate: float = 0.0  # connection aborted mid-stream
    malformed_rate: float = 0.0  # one event that is not valid JSON, mid-stream
    stall_rate: float = 0.0  # the stream pauses for stall_seconds mid-stream
    stall_seconds: float = 2.0
    slow_header_rate: float = 0.0  # response headers delayed by slow_header_seconds
    slow_header_seconds: float = 2.0

    def check(self) -> None:
        """Refuse rates outside [0, 1] and negative durations, naming the `llmload sim` flag."""
        for name, flag in RATE_FLAGS.items():
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise UsageError(
                    f"{flag} must be in [0, 1] (0.01: one request in 100), not {value}"
                )
        for name in ("stall_seconds", "slow_header_seconds"):
            value = getattr(self, name)
            if not value >= 0 or value == float("inf"):
                raise UsageError(f"--{name.replace('_', '-')} must be >= 0 seconds, not {value}")

    @property
    def any(self) -> bool:
        return any(
            (
                self.error_rate,
                self.drop_rate,
                self.malformed_rate,
                self.stall_rate,
                self.slow_header_rate,
            )
        )


@dataclass(frozen=True)
class FaultPlan:
    """The faults one request will suffer. Token positions count generated tokens (>= 1)."""

    error_500: bool = False
    slow_header: float = 0.0  # seconds
    drop_at: int = 0  # abort the connection once this many tokens were generated; 0 = never
    malformed_at: int = 0  # write a malformed event after this many tokens; 0 = never
    stall_at: int = 0  # pause after this many tokens; 0 = never
    stall_seconds: float = 0.0

    @property
    def names(self) -> list[str]:
        out = []
        if self.error_500:
            out.append("error_500")
        if self.slow_header:
            out.append("slow_header")
        if self.drop_at:
            out.append("drop")
        if self.malformed_at:
            out.append("malformed")
        if self.stall_at:
            out.append("stall")
        return out


NO_FAULTS = FaultPlan()


def draw_faults(config: FaultConfig, rng: random.Random, output_tokens: int) -> FaultPlan:
    """Draw one request's faults. Mid-stream faults land strictly inside the output."""
    if not config.any:
        return NO_FAULTS
    if config.error_rate and rng.random() < config.error_rate:
        return FaultPlan(error_500=True)

    def position() -> int:
        # After at least one token and before the last one, when there is room.
        return rng.randint(1, output_tokens - 1) if output_tokens > 1 else 1

    slow = config.slow_header_seconds if rng.random() < config.slow_header_rate else 0.0
    drop = position() if rng.random() < config.drop_rate else 0
    malformed = position() if rng.random() < config.malformed_rate else 0
    stall = position() if rng.random() < config.stall_rate else 0
    return FaultPlan(
        slow_header=slow,
        drop_at=drop,
        malformed_at=malformed,
        stall_at=stall,
        stall_seconds=config.stall_seconds if stall else 0.0,
    )
