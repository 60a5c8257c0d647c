"""Start-up work done once, before the first measured request, so the run never pays for it.

The first time a worker seals a part it would otherwise initialise Arrow's conversion and
compute kernels, the Parquet writer and its zstd codec: about half a second of CPU holding
the GIL, which stalls every stream in flight (measured: one stall of 140–340 ms per run at
concurrency 64 before this existed). `warm_up()` runs that whole path on a few dummy rows of
every table, in memory, and `freeze_gc()` then moves every object start-up made into the
garbage collector's permanent generation, so full collections during the run only scan the
run's own objects. docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import gc
import importlib.abc
import io
import logging
import sys
import time
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from locustfiles.request.record import RequestRecord
from locustfiles.sink.encode import EncodeContext, encode_chunks, encode_requests, encode_rows
from locustfiles.sink.spool import write_parquet

log = logging.getLogger("llmload.warmup")


def steady_allocator() -> str:
    """Arrow's buffers from jemalloc (else the system's malloc), not its default mimalloc;
    returns the pool's name. mimalloc hands freed pages back to the OS within milliseconds, so
    each of the sink's encodes (every 0.25 s) took its memory anew, page faults and zeroing
    included: on the benchmark machine a 4,000-row slice that takes 0.6-0.9 ms alone held the
    loop 3-6 ms during a run and 25-52 ms at its start, enough to push an open loop of 1,500
    arrivals/s past 10 ms of slip; with jemalloc or malloc no slice took 3 ms. Process-wide:
    buffers made before keep their pool."""
    import pyarrow as pa

    for pool in (pa.jemalloc_memory_pool, pa.system_memory_pool):
        try:
            chosen = pool()
        except (NotImplementedError, pa.ArrowException):  # not built into this pyarrow
            continue
        pa.set_memory_pool(chosen)
        return str(chosen.backend_name)
    return str(pa.default_memory_pool().backend_name)


class _Refuse(importlib.abc.MetaPathFinder):
    """An import finder that refuses one top-level module (for `pyarrow_without_pandas`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == self.name:
            raise ImportError(f"{fullname} is not loaded in a worker process")
        return None


def pyarrow_without_pandas() -> bool:
    """Keep pandas out of this process: pyarrow imports it on its first `pa.array` when it is
    installed (its pandas shim tries once per process, to recognise DataFrames), which costs a
    worker ~0.4 s of start-up and ~60 MB it never uses; the sink builds Arrow arrays from Python
    lists and numpy only. The shim's one try runs here with pandas refused, so pyarrow takes
    pandas as absent from then on; a later explicit `import pandas` still works. A process
    that already has pandas (a test's) is left as it is. Returns whether it refused."""
    if "pandas" in sys.modules:
        return False
    import pyarrow as pa

    refuse = _Refuse("pandas")
    sys.meta_path.insert(0, refuse)
    try:
        pa.array([0])  # the shim's one import attempt
    finally:
        sys.meta_path.remove(refuse)
    return True


def warm_up(ctx: EncodeContext) -> float:
    """Encode and write (in memory) a few rows of every table; returns the seconds it took."""
    started = time.perf_counter()
    record = RequestRecord("warm-up", 0, 1, False, "warm-up", "chat", None, True, 1, 1, "0" * 64)
    record.fail("client_error", "warm-up row, never stored")
    tables = [
        encode_requests([record.row()], ctx).table,
        encode_chunks([("warm-up", [1, 2], [1, 1], [1, 1], "content")], ctx).table,
        encode_rows(
            "samples",
            [{"at_ns": 1, "interval_ns": 1, "cpu_percent": 0.0, "loop_lag_us": [0, 1]}],
            ctx,
        ).table,  # fmt: skip
        encode_rows("stalls", [{"started_at_ns": 1, "length_ns": 1}], ctx).table,
    ]
    for table in tables:
        write_parquet(table, io.BytesIO())
    return time.perf_counter() - started


def freeze_gc() -> None:
    """Collect once, then keep every surviving object out of later collections."""
    gc.collect()
    gc.freeze()
    log.info(
        "llmload: %d start-up objects frozen out of the garbage collector", gc.get_freeze_count()
    )
