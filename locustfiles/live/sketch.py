"""A bounded, mergeable quantile sketch (DDSketch) with a small sparse wire form.

    s = Sketch()
    s.add(0.25)                       # one sample
    s.add(0.01, 4)                    # four samples of 0.01 (per-token ITL weights)
    s.add_keyed({key: weight}, ...)   # samples already binned (see `key`), fast path
    s.add_keyed(*s.bin_array(values)) # a request's many samples binned at once (numpy)
    wire = s.to_wire()                # JSON/msgpack-able, non-empty bins only
    t = Sketch.from_wire(wire); t.merge(s)
    t.quantile(0.99); t.cumulative([0.1, 1.0])

Relative accuracy RELATIVE_ACCURACY (1%): any quantile is within 1% of the exact value of
the sample at that rank. At most BIN_LIMIT bins per sketch: values from the largest down to
1/8e8 of it (1 µs to 13 min) keep that accuracy; smaller ones collapse into the lowest bin. Merging adds bin counts: the merge of two sketches is the sketch of all values.

The library's sketch keeps its bins in a dense store; this module is the one place that
reads or writes those internals (`_store`, `_zero_count`, summary fields).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from ddsketch import LogCollapsingLowestDenseDDSketch

RELATIVE_ACCURACY = 0.01
BIN_LIMIT = 1024


class Sketch:
    """A DDSketch of non-negative values (seconds), relative accuracy 1%, bounded size."""

    __slots__ = ("_dd",)

    def __init__(self) -> None:
        self._dd = LogCollapsingLowestDenseDDSketch(RELATIVE_ACCURACY, BIN_LIMIT)

    # -- adding -----------------------------------------------------------------------
    def add(self, value: float, weight: float = 1.0) -> None:
        if weight > 0:
            self._dd.add(max(value, 0.0), weight)

    def key(self, value: float) -> int | None:
        """The bin of `value`; None for values the sketch counts as zero."""
        mapping = self._dd._mapping
        return mapping.key(value) if value > mapping.min_possible else None

    def key_function(self) -> Callable[[float], int | None]:
        """`key` as a closure over the mapping's constants (the per-event fast path):
        math.ceil(log2(value) * multiplier + offset), as LogarithmicMapping.key computes."""
        mapping = self._dd._mapping
        multiplier, offset, tiny = mapping._multiplier, mapping._offset, mapping.min_possible
        log, ceil = math.log, math.ceil

        def key(value: float) -> int | None:
            return int(ceil(log(value, 2) * multiplier) + offset) if value > tiny else None

        return key

    def bin_array(
        self, values: np.ndarray, weights: np.ndarray | None = None, zeros: float = 0.0
    ) -> tuple[dict[int | None, float], float, float, float, float]:
        """Many samples binned at once, as `add_keyed` takes them: (bins, total, weighted sum,
        min, max). `values` (float64) weigh `weights` each (1 when None); `zeros` adds that
        weight of samples of 0. The keys are `key`'s, exactly: numpy's log may differ from
        the C library's in the last bits, so a value whose scaled log lies within 1e-9 of a
        bin edge is keyed by `key` itself (tests/unit/test_live.py holds both to the same
        bins). The weighted sum is numpy's (pairwise), within rounding of a running sum."""
        mapping = self._dd._mapping
        multiplier, offset, tiny = mapping._multiplier, mapping._offset, mapping.min_possible
        live = values > tiny
        vals = values[live]
        bins: dict[int | None, float] = {}
        if weights is None:
            zero = float(len(values) - len(vals)) + zeros
            total, value_sum = float(len(values)) + zeros, float(values.sum())
        else:
            zero = float(weights[~live].sum()) + zeros
            total, value_sum = float(weights.sum()) + zeros, float(np.dot(values, weights))
        if zero:
            bins[None] = zero
        if len(vals):
            scaled = np.log(vals) / math.log(2.0) * multiplier  # math.log(v, 2) * multiplier
            keys = (np.ceil(scaled) + offset).astype(np.int64)
            edge = np.flatnonzero(np.abs(scaled - np.rint(scaled)) < 1e-9)
            if len(edge):
                key = self.key_function()
                keys[edge] = [key(float(v)) for v in vals[edge]]
            low = int(keys.min())
            counts = np.bincount(keys - low, None if weights is None else weights[live])
            held = np.flatnonzero(counts)
            bins.update(
                zip((held + low).tolist(), counts[held].astype(float).tolist(), strict=True)
            )
        lo = float(values.min()) if len(values) else math.inf
        hi = float(values.max()) if len(values) else 0.0
        if zeros:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        return bins, total, value_sum, lo, hi

    def add_keyed(
        self, bins: Mapping[int | None, float], total: float, value_sum: float, lo: float, hi: float
    ) -> None:
        """Add samples already binned with `key` (None: zero): `bins` maps key -> weight;
        `total`, `value_sum`, `lo`, `hi`: their weight, weighted sum, min and max."""
        if total <= 0:
            return
        dd = self._dd
        for key, weight in bins.items():
            if key is None:
                dd._zero_count += weight
            else:
                dd._store.add(key, weight)
        dd._count += total
        dd._sum += value_sum
        dd._min = min(dd._min, lo)
        dd._max = max(dd._max, hi)

    def merge(self, other: Sketch) -> None:
        self._dd.merge(other._dd)

    # -- reading ----------------------------------------------------------------------
    @property
    def count(self) -> float:
        return float(self._dd.count)

    @property
    def sum(self) -> float:
        return float(self._dd.sum)

    def quantile(self, q: float) -> float | None:
        """The value at quantile q (0..1); None when empty (never 0 for "no data")."""
        if self._dd.count <= 0:
            return None
        value = self._dd.get_quantile_value(q)
        return None if value is None else float(value)

    def bins(self) -> list[tuple[int, float]]:
        """Non-empty bins (key, weight), ascending."""
        store = self._dd._store
        offset = store.offset
        return [(i + offset, c) for i, c in enumerate(store.bins) if c]

    @property
    def size(self) -> int:
        """Bins held (the store's length): bounded by BIN_LIMIT."""
        return int(self._dd._store.length())

    def cumulative(self, bounds: Iterable[float]) -> list[float]:
        """Weight of samples <= each bound (ascending bounds), each bin placed at its
        representative value: a bucket edge is as fuzzy as the sketch (1%)."""
        mapping = self._dd._mapping
        out: list[float] = []
        running = float(self._dd._zero_count)
        pending = iter(self.bins())
        nxt = next(pending, None)
        for bound in bounds:
            while nxt is not None and mapping.value(nxt[0]) <= bound:
                running += nxt[1]
                nxt = next(pending, None)
            out.append(running)
        return out

    # -- wire form --------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        """Non-empty bins only: {"k": keys, "n": weights, "z": zero weight, "c", "s", "lo", "hi"}."""
        dd = self._dd
        pairs = self.bins()
        return {
            "k": [k for k, _ in pairs],
            "n": [n for _, n in pairs],
            "z": dd._zero_count,
            "c": dd.count,
            "s": dd.sum,
            "lo": dd._min if dd.count else None,
            "hi": dd._max if dd.count else None,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Sketch:
        """The sketch `to_wire` described. Raises ValueError for a malformed form."""
        sketch = cls()
        try:
            keys, weights = list(wire["k"]), list(wire["n"])
            pairs = zip(keys, weights, strict=True)
            bins: dict[int | None, float] = {int(k): float(n) for k, n in pairs}
            zero = float(wire.get("z") or 0.0)
            if zero:
                bins[None] = zero
            total = float(wire["c"])
            if total > 0:
                sketch.add_keyed(
                    bins, total, float(wire["s"]), float(wire["lo"]), float(wire["hi"])
                )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"sketch wire form: {exc!r}") from None
        return sketch
