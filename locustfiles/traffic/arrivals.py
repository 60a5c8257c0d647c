"""Open-loop arrivals: one seeded schedule per rate step, shared out across workers.

    schedule = Schedule(rate=40.0, arrival="poisson", seed=0, step=2)
    for index, offset_s in schedule.share(position=1, count=2):   # this worker's arrivals
        ...   # arrival `index` of the step is due `offset_s` after the step's start

Every worker computes the same global schedule from (seed, step): the gaps between
arrivals are drawn from the arrival process at the step's rate, arrival i is due at the
sum of the first i + 1 gaps, and goes to the worker at share position `i % count`. The
merged arrivals of all workers are therefore the one schedule, whatever the number of
workers; no worker runs its own rate that only adds up on average.

Arrival processes (`--arrival`), with mean gap 1 / rate:
- `poisson`: exponential gaps (coefficient of variation 1);
- `constant`: every gap 1 / rate;
- `gamma:CV`: gamma gaps with shape 1 / CV² (CV > 1 burstier than Poisson, < 1 more
  regular), as the burstiness of vLLM's `bench serve`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator


def gap_sampler(rate: float, arrival: str, rng: random.Random) -> Callable[[], float]:
    """A function giving the next gap (seconds) of the arrival process at `rate`/s."""
    mean = 1.0 / rate
    if arrival == "constant":
        return lambda: mean
    if arrival == "poisson":
        return lambda: rng.expovariate(rate)
    if arrival.startswith("gamma:"):
        cv = float(arrival.split(":", 1)[1])
        shape = 1.0 / (cv * cv)
        scale = mean / shape
        return lambda: rng.gammavariate(shape, scale)
    raise ValueError(f"unknown arrival process {arrival!r}")


class Schedule:
    """The global arrival schedule of one rate step (times in seconds from its start)."""

    def __init__(self, rate: float, arrival: str, seed: int, step: int) -> None:
        self.rate = rate
        self.arrival = arrival
        self.seed = seed
        self.step = step

    def arrivals(self) -> Iterator[tuple[int, float]]:
        """Every arrival of the step, in order: (index, seconds after the start)."""
        rng = random.Random(f"llmload-arrivals:{self.seed}:{self.step}")
        gap = gap_sampler(self.rate, self.arrival, rng)
        t = 0.0
        index = 0
        while True:
            t += gap()
            yield index, t
            index += 1

    def share(self, position: int, count: int) -> Iterator[tuple[int, float]]:
        """The arrivals of the worker at share `position` of `count`: i % count == position."""
        if not 0 <= position < count:
            raise ValueError(f"share position {position} is not in 0..{count - 1}")
        for index, t in self.arrivals():
            if index % count == position:
                yield index, t


def worker_cap(max_concurrency: int, position: int, count: int) -> int:
    """One worker's part of the global cap (0: no cap): N // n, one more for the first
    N % n shares, at least 1 (a cap below the number of workers is exceeded, and said so)."""
    if max_concurrency <= 0:
        return 0
    base, extra = divmod(max_concurrency, count)
    return max(1, base + (1 if position < extra else 0))
