"""Canary: the ddsketch internals that locustfiles/live/sketch.py reads keep their shape.

sketch.py bins values itself (the per-event fast path), and writes bins, counts and bounds
straight into the library's sketch (`_store`, `_zero_count`, `_count`, `_sum`, `_min`, `_max`,
`_mapping._multiplier`, `_mapping._offset`). pyproject.toml bounds ddsketch below its next
major for that; a failure here names what changed: adapt sketch.py before moving the bound.
"""

from __future__ import annotations

import math
from importlib.metadata import version
from typing import Any

import pytest
from ddsketch import LogCollapsingLowestDenseDDSketch

from locustfiles.live.sketch import BIN_LIMIT, RELATIVE_ACCURACY, Sketch

FIELDS = {
    "sketch": ("_mapping", "_store", "_zero_count", "_count", "_sum", "_min", "_max"),
    "sketch._mapping": ("_multiplier", "_offset", "min_possible", "key", "value"),
    "sketch._store": ("add", "offset", "bins", "length"),
}


def changed(what: str) -> str:
    return (
        f"ddsketch {version('ddsketch')} changed {what}, which locustfiles/live/sketch.py "
        "reads: adapt sketch.py (and this canary) before widening the ddsketch bound"
    )


def fresh() -> Any:
    return LogCollapsingLowestDenseDDSketch(RELATIVE_ACCURACY, BIN_LIMIT)


def test_the_private_fields_are_there() -> None:
    dd = fresh()
    objects = {"sketch": dd, "sketch._mapping": dd._mapping, "sketch._store": dd._store}
    missing = [
        f"{owner}.{name}"
        for owner, names in FIELDS.items()
        for name in names
        if not hasattr(objects[owner], name)
    ]
    assert not missing, changed(f"its fields ({', '.join(missing)} gone)")


def test_counts_bounds_and_zero_weight_are_plain_numbers() -> None:
    dd = fresh()
    dd.add(0.0)
    dd.add(0.25, 3.0)
    dd.add(2.0)
    got = (dd._zero_count, dd._count, dd._sum, dd._min, dd._max)
    assert got == (1.0, 5.0, 2.75, 0.0, 2.0), changed(
        f"the meaning of _zero_count/_count/_sum/_min/_max (got {got})"
    )


def test_bin_keys_are_the_logarithmic_formula_sketch_py_inlines() -> None:
    mapping = fresh()._mapping
    inlined = Sketch().key_function()
    values = [1e-6, 3.3e-4, 0.01, 0.25, 1.0, 7.5, 120.0, 800.0]
    wrong = [v for v in values if inlined(v) != mapping.key(v)]
    assert not wrong, changed(
        f"LogarithmicMapping.key (ceil(log2(v) * _multiplier) + _offset) for {wrong}"
    )
    assert inlined(mapping.min_possible) is None
    assert all(abs(mapping.value(mapping.key(v)) - v) <= RELATIVE_ACCURACY * v for v in values), (
        changed("LogarithmicMapping.value")
    )


def test_the_store_is_a_dense_list_from_offset() -> None:
    dd = fresh()
    dd.add(0.25, 3.0)
    dd.add(2.0)
    store, key = dd._store, dd._mapping.key
    dd._store.add(key(2.0), 2.0)  # what Sketch.add_keyed does
    assert isinstance(store.bins, list) and isinstance(store.offset, int), changed(
        f"the store's bins/offset ({type(store.bins).__name__}, {type(store.offset).__name__})"
    )
    assert store.length() == len(store.bins), changed("DenseStore.length()")
    held = {i + store.offset: c for i, c in enumerate(store.bins) if c}
    assert held == {key(0.25): 3.0, key(2.0): 3.0}, changed(f"the store's layout (got {held})")


def test_the_sketch_reads_back_what_it_wrote() -> None:
    sketch = Sketch()
    for v in (0.0, 0.01, 0.02, 0.5, 3.0):
        sketch.add(v)
    copy = Sketch.from_wire(sketch.to_wire())
    assert copy.to_wire() == sketch.to_wire()
    assert copy.count == 5 and copy.quantile(1.0) == pytest.approx(3.0, rel=RELATIVE_ACCURACY)
    assert math.isclose(copy.sum, 3.53)
