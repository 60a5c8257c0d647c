"""Synthetic runs of any size in the documented layout, written part by part.

    run_dir = write_run(root, n_requests=1_000_000, chunks_per_request=10, workers=8, parts=5)

Each (worker, part) is drawn from its own seeded generator and written before the next is
drawn, so memory stays at one part whatever the run's size (bench/bench_scale.py writes a
billion chunk rows this way). Six concurrency steps of STEP_S seconds plus a cold group;
chunks carry 1 or 2 tokens (one in ten carries 2); about 0.5% of requests fail (HTTP 500).
Request ids are unique across the run; the workers' indexes are final and list every part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.kernel.layout import part_key
from analysis.kernel.schema import CHUNKS_SCHEMA, REQUESTS_SCHEMA, SCHEMA_VERSION

T0_NS: Final = 1_700_000_000_000_000_000
STEPS: Final = (1, 2, 4, 8, 16, 32)
STEP_S: Final = 600.0
WARMUP_S: Final = 10.0
RUN_ID: Final = "bench-run"


def _const(value: object, n: int, type_: pa.DataType) -> pa.Array:
    return pa.array([value], type_).take(pa.array(np.zeros(n, dtype=np.int32)))


def _share(total: int, ways: int, i: int) -> int:
    """The i-th of `ways` near-equal shares of `total`."""
    return total // ways + (1 if i < total % ways else 0)


def _part(
    run_id: str, wid: str, first: int, m: int, k: int, cold_left: int, seed: tuple[int, ...]
) -> tuple[pa.Table, pa.Table]:
    """One requests part and its chunks part: requests `first` .. `first + m - 1`."""
    rng = np.random.default_rng(seed)
    ids = np.char.zfill(np.char.mod("%x", np.arange(first, first + m, dtype=np.int64)), 32)
    cold = np.zeros(m, dtype=bool)
    cold[: min(cold_left, m)] = True
    step = rng.integers(0, len(STEPS), m).astype(np.int32)
    sent_s = 10.0 + step * STEP_S + rng.uniform(0, STEP_S - 5.0, m)
    sent_s[cold] = rng.uniform(0, 5.0, int(cold.sum()))
    step[cold] = 0
    conc = np.array(STEPS, dtype=np.int32)[step]
    conc[cold] = 1
    sent = (T0_NS + sent_s * 1e9).astype(np.int64)
    gaps = rng.exponential(0.02, (m, k))
    gaps[:, 0] = rng.uniform(0.05, 0.3, m)
    offsets_ns = (np.cumsum(gaps, axis=1) * 1e9).astype(np.int64)
    tokens = np.where(rng.random((m, k)) < 0.1, 2, 1).astype(np.int32)
    failed = rng.random(m) < 0.005
    end_ns = offsets_ns[:, -1] + 1_000_000
    out_tokens = tokens.sum(axis=1).astype(np.int32)
    req = {
        "run_id": _const(run_id, m, pa.string()),
        "worker_id": _const(wid, m, pa.string()),
        "request_id": pa.array(ids, pa.string()),
        "step": pa.array(step),
        "concurrency": pa.array(conc),
        "stream": _const(True, m, pa.bool_()),
        "prompt_tokens_requested": _const(512, m, pa.int32()),
        "max_tokens": _const(2 * k, m, pa.int32()),
        "sent_at_ns": pa.array(sent),
        "headers_ns": pa.array(offsets_ns[:, 0] // 2),
        "first_event_ns": pa.array(offsets_ns[:, 0]),
        "first_token_ns": pa.array(offsets_ns[:, 0]),
        "first_content_ns": pa.array(offsets_ns[:, 0]),
        "last_token_ns": pa.array(offsets_ns[:, -1]),
        "end_ns": pa.array(end_ns),
        "http_status": pa.array(np.where(failed, 500, 200).astype(np.int32)),
        "status": pa.array(np.where(failed, "error", "ok").astype(object), pa.string()),
        "error_kind": pa.array(np.where(failed, "http_5xx", None).astype(object), pa.string()),
        "prompt_tokens": _const(512, m, pa.int32()),
        "completion_tokens": pa.array(out_tokens),
        "output_tokens": pa.array(out_tokens),
        "events": _const(k + 2, m, pa.int32()),
        "cold": pa.array(cold),
    }
    requests = pa.Table.from_arrays(
        [req.get(f.name, pa.nulls(m, f.type)).cast(f.type) for f in REQUESTS_SCHEMA],
        schema=REQUESTS_SCHEMA,
    )
    mk = m * k
    chunk_cols = {
        "run_id": _const(run_id, mk, pa.string()),
        "worker_id": _const(wid, mk, pa.string()),
        "request_id": pa.DictionaryArray.from_arrays(
            np.repeat(np.arange(m, dtype=np.int32), k), pa.array(ids, pa.string())
        ),
        "seq": pa.array(np.tile(np.arange(k, dtype=np.int32), m)),
        "offset_ns": pa.array(offsets_ns.ravel()),
        "tokens": pa.array(tokens.ravel()),
        "chars": pa.array(tokens.ravel() * 4),
        "kind": _const("content", mk, pa.string()),
    }
    chunks = pa.Table.from_arrays(
        [chunk_cols[f.name].cast(f.type) for f in CHUNKS_SCHEMA], schema=CHUNKS_SCHEMA
    )
    return requests, chunks


def write_run(
    root: Path,
    n_requests: int,
    chunks_per_request: int = 10,
    workers: int = 8,
    parts: int = 5,
    *,
    run_id: str = RUN_ID,
    seed: int = 42,
) -> Path:
    """Write a run of `n_requests` requests under root/run_id; returns its folder."""
    run_dir = root / run_id
    cold_total = min(100, n_requests // 100)
    first = 0
    for w in range(workers):
        wid = f"worker-{w:02d}"
        index: dict[str, int] = {}
        n_worker = _share(n_requests, workers, w)
        for p in range(parts):
            m = _share(n_worker, parts, p)
            cold_left = max(0, cold_total - first)
            requests, chunks = _part(run_id, wid, first, m, chunks_per_request, cold_left,
                                     (seed, w, p))  # fmt: skip
            first += m
            for table, name in ((requests, "requests"), (chunks, "chunks")):
                key = part_key(name, wid, p)
                (run_dir / key).parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(table, run_dir / key)
                index[key] = len(table)
        (run_dir / "index").mkdir(parents=True, exist_ok=True)
        (run_dir / f"index/worker={wid}.json").write_text(json.dumps({
            "schema_version": SCHEMA_VERSION, "run_id": run_id, "worker_id": wid,
            "final": True, "parts": index,
        }))  # fmt: skip
    steps = [
        {
            "step": i,
            "concurrency": c,
            "started_at_ns": int(T0_NS + (10.0 + i * STEP_S) * 1e9),
            "spawned_at_ns": int(T0_NS + (10.0 + i * STEP_S + 1.0) * 1e9),
            "ended_at_ns": int(T0_NS + (10.0 + (i + 1) * STEP_S) * 1e9),
            "warmup_s": WARMUP_S,
        }
        for i, c in enumerate(STEPS)
    ]
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "kind": "llmload.manifest",
        "run_id": run_id,
        "status": "finished",
        "target": {"url": "http://sim", "model": "sim", "simulated": True},
        "versions": {"llmload": "bench"},
        "workers": [{"worker_id": f"worker-{w:02d}"} for w in range(workers)],
        "steps": steps,
        "cold_start": {"requests": cold_total, "concurrency": 1},
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir
