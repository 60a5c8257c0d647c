"""Build runs from known events: Parquet parts in the documented layout, a manifest, indexes.

    run = RunBuilder("r1", simulated=True)
    run.add_step(0, 2, started_s=0, spawned_s=1, ended_s=11, warmup_s=1)
    run.add_request(step=0, concurrency=2, sent_s=2.0, chunks=[(0.1, 1), (0.3, 2)], end_s=0.35)
    uri = run.write(tmp_path / "events")        # -> "<events-uri>/r1"

Open-loop (rate) steps, schema 1.2:

    run.add_rate_step(0, 5.0, started_s=0, ended_s=3, warmup_s=1, max_concurrency=2)
    run.add_arrival(step=0, rate=5.0, index=0, intended_s=1.1, slip_s=0.002, chunks=[(0.05, 1)])
    run.add_arrival(step=0, rate=5.0, index=1, intended_s=1.3, dropped=True)

Sessions, schema 1.3: turns sent one after another (each `wait_s` after the previous end);
a chunk may name its kind, `(offset, tokens, "tool_call")` (a request with a `reasoning` chunk
gets the schema 1.5 columns its chunks imply: first reasoning, first answer, reasoning tokens):

    run.add_session("s1", step=0, started_s=2.0, planned=2, turns=[
        {"chunks": [(0.1, 3, "tool_call")], "tool_calls": 1, "prompt_tokens": 120},
        {"kind": "tool_result", "wait_s": 0.5, "chunks": [(0.1, 2)], "cached_tokens": 96},
        {"wait_s": 1.0, "chunks": [(0.2, 4)]},
    ])

Times are seconds: `sent_s` from the run's wall-clock origin T0_NS, offsets from the send.
Written through analysis.kernel.storage, so an `s3://` events URI works too; `write(...,
schema_version="1.1")` writes parts and a manifest as a 1.1 writer did (no 1.2 columns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.kernel.layout import MANIFEST_NAME, WorkerIndex, index_key, part_key
from analysis.kernel.schema import (
    CHUNKS_SCHEMA,
    OPEN_LOOP_COLUMNS_1_2,
    REQUESTS_SCHEMA,
    SAMPLES_SCHEMA,
    SCHEMA_VERSION,
    SESSION_COLUMNS_1_3,
    STALLS_SCHEMA,
    WORKER_DELAY_COLUMNS_1_1,
)
from analysis.kernel.storage import join_uri, open_store

T0_NS = 1_700_000_000_000_000_000

NEWER_COLUMNS = {
    "1.0": (*WORKER_DELAY_COLUMNS_1_1, *OPEN_LOOP_COLUMNS_1_2, *SESSION_COLUMNS_1_3),
    "1.1": (*OPEN_LOOP_COLUMNS_1_2, *SESSION_COLUMNS_1_3),
    "1.2": SESSION_COLUMNS_1_3,
}
"""Request columns a writer of that schema version did not have."""


def as_version(schema: pa.Schema, version: str) -> pa.Schema:
    """`schema` as a writer of `version` wrote it: newer request columns gone, version stamped."""
    keep = [f for f in schema if f.name not in NEWER_COLUMNS.get(version, ())]
    return pa.schema(keep, metadata={b"llmload.schema_version": version.encode()})


def ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _parquet(rows: list[dict[str, Any]], schema: pa.Schema) -> bytes:
    table = pa.Table.from_pylist(rows, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


@dataclass
class RunBuilder:
    run_id: str = "run-1"
    simulated: bool = False
    workers: tuple[str, ...] = ("w1",)
    model: str = "tiny-llama"
    requests: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    stalls: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # part keys written by write()

    def add_step(
        self,
        step: int,
        concurrency: int,
        *,
        started_s: float,
        spawned_s: float,
        ended_s: float,
        warmup_s: float = 0.0,
    ) -> None:
        self.steps.append(
            {
                "step": step,
                "concurrency": concurrency,
                "started_at_ns": T0_NS + ns(started_s),
                "spawned_at_ns": T0_NS + ns(spawned_s),
                "ended_at_ns": T0_NS + ns(ended_s),
                "warmup_s": warmup_s,
            }
        )

    def add_rate_step(
        self,
        step: int,
        rate: float,
        *,
        started_s: float,
        ended_s: float,
        warmup_s: float = 0.0,
        max_concurrency: int = 0,
        over_cap: str = "wait",
        arrival: str = "poisson",
    ) -> None:
        """An open-loop step as the master records it: no spawn ramp, `concurrency` = the cap."""
        self.add_step(step, max_concurrency, started_s=started_s, spawned_s=started_s,
                      ended_s=ended_s, warmup_s=warmup_s)  # fmt: skip
        self.steps[-1].update(rate=rate, arrival=arrival, max_concurrency=max_concurrency,
                              over_cap=over_cap, share_workers=list(self.workers))  # fmt: skip

    def add_arrival(
        self,
        *,
        step: int,
        rate: float,
        index: int,
        intended_s: float,
        slip_s: float = 0.0,
        queued_s: float = 0.0,
        max_concurrency: int = 0,
        dropped: bool = False,
        chunks: list[tuple[float, int]] = (),  # type: ignore[assignment]
        **extra: Any,
    ) -> str:
        """One arrival of a rate step: sent at intended + queued + slip (exact ns), or dropped
        (status `dropped`, sent_at_ns = the drop time, no response times)."""
        intended_ns = T0_NS + ns(intended_s)
        columns: dict[str, Any] = {
            "rate": rate,
            "arrival_index": index,
            "intended_ns": intended_ns,
            "queued_ns": ns(queued_s),
            "sent_at_ns": intended_ns + ns(queued_s) + ns(slip_s),
        }
        if dropped:
            columns.update(
                headers_ns=None, end_ns=None, http_status=None, events=0, output_tokens=None,
                error_detail=None,
            )  # fmt: skip
            return self.add_request(
                sent_s=intended_s, step=step, concurrency=max_concurrency, status="dropped",
                **columns, **extra,
            )  # fmt: skip
        return self.add_request(
            sent_s=intended_s, step=step, concurrency=max_concurrency, chunks=chunks,
            **columns, **extra,
        )  # fmt: skip

    def add_session(
        self,
        session_id: str,
        *,
        started_s: float,
        turns: list[dict[str, Any]],
        planned: int | None = None,
        step: int = 0,
        concurrency: int = 1,
        worker: str | None = None,
        history_per_turn: int = 0,
    ) -> list[str]:
        """One session's turns as a 1.3 writer records them: turn i is sent `wait_s` after
        turn i-1 ended (turn 0 at `started_s`, `wait_ns` 0); each dict holds add_request
        arguments plus `wait_s`, `kind` (turn_kind, default `user`) and `tool_calls`
        (default 0). `planned`: session_turns (default: the user turns given). Each turn
        resends `history_per_turn` tokens per earlier turn (history_tokens)."""
        users = sum(1 for t in turns if t.get("kind", "user") == "user")
        sent_s, ids = started_s, []
        for i, spec in enumerate(turns):
            spec = dict(spec)
            wait_s = spec.pop("wait_s", 0.0) if i else 0.0
            sent_s += wait_s
            chunks = spec.get("chunks", ())
            spec.setdefault("end_s", (chunks[-1][0] + 0.01) if chunks else 0.05)
            ids.append(
                self.add_request(
                    sent_s=sent_s,
                    step=spec.pop("step", step),
                    concurrency=concurrency,
                    worker=worker,
                    session_id=session_id,
                    turn=i,
                    session_turns=planned if planned is not None else users,
                    turn_kind=spec.pop("kind", "user"),
                    wait_ns=ns(wait_s),
                    tool_calls=spec.pop("tool_calls", 0),
                    history_tokens=spec.pop("history_tokens", history_per_turn * i),
                    **spec,
                )  # fmt: skip
            )
            sent_s += spec["end_s"]
        return ids

    def add_request(
        self,
        *,
        sent_s: float,
        chunks: list[tuple[float, int] | tuple[float, int, str]] = (),  # type: ignore[assignment]
        end_s: float | None = None,
        step: int = 0,
        concurrency: int = 1,
        worker: str | None = None,
        status: str = "ok",
        error_kind: str | None = None,
        cold: bool = False,
        prompt_tokens: int | None = None,
        prompt_tokens_requested: int | None = 100,
        max_tokens: int | None = 64,
        output_tokens: int | None = None,
        request_id: str | None = None,
        **extra: Any,  # other request columns (schema 1.1: worker_stall_ns, coalesced_events...)
    ) -> str:
        worker = worker or self.workers[0]
        rid = request_id or f"req-{len(self.requests):04d}"
        kinds = [c[2] if len(c) > 2 else "content" for c in chunks]  # type: ignore[misc]
        offsets = [ns(c[0]) for c in chunks]
        with_tokens = [ns(c[0]) for c in chunks if c[1] > 0]  # any kind: output tokens
        content = [
            ns(c[0]) for c, k in zip(chunks, kinds, strict=True) if c[1] > 0 and k == "content"
        ]
        total = sum(c[1] for c in chunks)
        if "reasoning" in kinds:  # a reasoning answer: its 1.5 columns, from its chunks
            told = [(ns(c[0]), c[1], k) for c, k in zip(chunks, kinds, strict=True) if c[1] > 0]
            extra.setdefault(
                "first_reasoning_ns", next((t for t, _, k in told if k == "reasoning"), None)
            )
            extra.setdefault(
                "first_answer_ns", next((t for t, _, k in told if k != "reasoning"), None)
            )
            extra.setdefault("reasoning_tokens",
                             sum(n for _, n, k in told if k == "reasoning"))  # fmt: skip
        if end_s is None:
            end_s = (chunks[-1][0] + 0.01) if chunks else 0.05
        self.requests.append(
            {
                "run_id": self.run_id,
                "worker_id": worker,
                "request_id": rid,
                "step": step,
                "concurrency": concurrency,
                "scenario": "D(100,64)",
                "endpoint": "chat",
                "model": self.model,
                "stream": True,
                "prompt_tokens_requested": prompt_tokens_requested,
                "max_tokens": max_tokens,
                "prompt_sha256": "0" * 64,
                "prompt_text": None,
                "sent_at_ns": T0_NS + ns(sent_s),
                "headers_ns": min([ns(0.001), *offsets, ns(end_s)]),
                "first_event_ns": offsets[0] if offsets else None,
                "first_token_ns": with_tokens[0] if with_tokens else None,
                "first_content_ns": content[0] if content else None,
                "last_token_ns": with_tokens[-1] if with_tokens else None,
                "end_ns": ns(end_s),
                "http_status": 200 if status == "ok" else 500,
                "status": status,
                "error_kind": error_kind,
                "error_detail": error_kind,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": output_tokens,
                "output_tokens": output_tokens if output_tokens is not None else (total or None),
                "output_tokens_source": "usage" if chunks else None,
                "events": len(chunks),
                "cold": cold,
                "server_request_id": None,
                **extra,
            }
        )
        for seq, ((offset, tokens, *_), kind) in enumerate(zip(chunks, kinds, strict=True)):
            self.chunks.append(
                {
                    "run_id": self.run_id,
                    "worker_id": worker,
                    "request_id": rid,
                    "seq": seq,
                    "offset_ns": ns(offset),
                    "tokens": tokens,
                    "chars": 4 * tokens,
                    "kind": kind,
                }
            )
        return rid

    def add_sample(
        self, worker: str, *, at_s: float, cpu: float, lags_us: list[int], interval_s: float = 1.0
    ) -> None:
        """One second of a worker's own measurements (samples table), ending at `at_s`."""
        self.samples.append(
            {"run_id": self.run_id, "worker_id": worker, "at_ns": T0_NS + ns(at_s),
             "interval_ns": ns(interval_s), "cpu_percent": cpu, "loop_lag_us": lags_us}
        )  # fmt: skip

    def add_stall(self, worker: str, *, start_s: float, length_s: float) -> None:
        self.stalls.append(
            {"run_id": self.run_id, "worker_id": worker, "started_at_ns": T0_NS + ns(start_s),
             "length_ns": ns(length_s)}
        )  # fmt: skip

    def manifest(self, schema_version: str = SCHEMA_VERSION) -> dict[str, Any]:
        cold = [r for r in self.requests if r["cold"]]
        return {
            "schema_version": schema_version,
            "kind": "llmload.manifest",
            "run_id": self.run_id,
            "status": "finished",
            "created_at": "2023-11-14T22:13:20Z",
            "ended_at": "2023-11-14T22:20:00Z",
            "target": {
                "url": "http://127.0.0.1:8000/v1",
                "model": self.model,
                "simulated": self.simulated,
                "server_version": "sim 0.1" if self.simulated else "vllm 0.9",
                "server_header": None,
            },
            "config": {"users": 8},
            "versions": {"llmload": "0.1.0", "locust": "2.37", "python": "3.11"},
            "hosts": ["host-a"],
            "workers": [
                {"worker_id": w, "host": "host-a", "pid": 100 + i}
                for i, w in enumerate(self.workers)
            ],
            "steps": self.steps,
            "cold_start": {"requests": len(cold), "concurrency": 1},
            **self.manifest_extra,
        }

    def write(
        self,
        events_uri: str | Path,
        *,
        parts_per_worker: int = 1,
        manifest: bool = True,
        index: bool = True,
        schema_version: str = SCHEMA_VERSION,
    ) -> str:
        """Write parts (requests split round-robin into parts), manifest and indexes.

        `schema_version` older than the current one writes parts without the request columns
        that version lacked (their values are dropped), stamped with that version."""
        run_uri = join_uri(str(events_uri), self.run_id)
        store = open_store(run_uri)
        requests_schema = as_version(REQUESTS_SCHEMA, schema_version)
        chunks_schema = as_version(CHUNKS_SCHEMA, schema_version)
        for worker in self.workers:
            parts: dict[str, int] = {}
            mine = [r for r in self.requests if r["worker_id"] == worker]
            for seq in range(parts_per_worker):
                reqs = [
                    {k: v for k, v in r.items() if k in requests_schema.names}
                    for r in mine[seq::parts_per_worker]
                ]
                ids = {r["request_id"] for r in reqs}
                chunks = [c for c in self.chunks if c["request_id"] in ids]
                for table, rows, schema in (
                    ("requests", reqs, requests_schema),
                    ("chunks", chunks, chunks_schema),
                ):
                    key = part_key(table, worker, seq)
                    store.put(key, _parquet(rows, schema))
                    parts[key] = len(rows)
                    self.keys.append(key)
            for table, rows, schema in (
                ("samples", self.samples, SAMPLES_SCHEMA),
                ("stalls", self.stalls, STALLS_SCHEMA),
            ):
                mine = [r for r in rows if r["worker_id"] == worker]
                if mine:
                    key = part_key(table, worker, 0)
                    store.put(key, _parquet(mine, schema))
                    parts[key] = len(mine)
                    self.keys.append(key)
            if index:
                doc = WorkerIndex(self.run_id, worker, parts, final=True)
                store.put(index_key(worker), doc.to_json(schema_version))
        if manifest:
            data = json.dumps(self.manifest(schema_version)).encode()
            store.put(MANIFEST_NAME, data, overwrite=True)
        return run_uri


@pytest.fixture
def events_dir(tmp_path: Path) -> Path:
    """An empty local events root (`<events-uri>`) for RunBuilder.write."""
    path = tmp_path / "events"
    path.mkdir()
    return path


def known_run(run_id: str = "known", *, simulated: bool = False) -> RunBuilder:
    """The hand-computed run of tests/integration/test_report_summary.py (values there).

    Cold group: 2 requests at 0 s and 1 s. Step 0 (c=1): window [12, 20] s, six requests
    (one before the window, one failure, one single-token answer, one whose last chunk and
    end fall after the window). Step 1 (c=4): window [22, 30] s, a request sent before the
    window whose tokens arrive inside it, a cancelled one, a failure with tokens. Step 2
    (c=8): window [30, 40] s, only failures. Two workers, two parts each.
    """
    b = RunBuilder(run_id, simulated=simulated, workers=("w1", "w2"))
    b.add_step(0, 1, started_s=10, spawned_s=10, ended_s=20, warmup_s=2)
    b.add_step(1, 4, started_s=20, spawned_s=21, ended_s=30, warmup_s=1)
    b.add_step(2, 8, started_s=30, spawned_s=30, ended_s=40, warmup_s=0)
    # cold group
    b.add_request(sent_s=0.0, cold=True, worker="w1", chunks=[(1.0, 1), (1.5, 1)], end_s=1.6)
    b.add_request(sent_s=1.0, cold=True, worker="w2", chunks=[(0.5, 2)], end_s=0.6)
    # step 0
    s0 = {"step": 0, "concurrency": 1}
    b.add_request(sent_s=11.0, **s0, worker="w2", chunks=[(0.1, 1), (0.2, 1)], end_s=0.25)
    b.add_request(
        sent_s=12.0,
        **s0,
        worker="w1",
        chunks=[(0.5, 1), (0.6, 2), (0.9, 1)],
        end_s=1.0,
        prompt_tokens=110,
    )
    b.add_request(
        sent_s=14.0,
        **s0,
        worker="w2",
        chunks=[(0.2, 3), (0.4, 1)],
        end_s=0.5,
        prompt_tokens=90,
        max_tokens=32,
    )
    b.add_request(sent_s=16.0, **s0, worker="w1", chunks=[(0.3, 1)], end_s=0.4)
    b.add_request(sent_s=18.0, **s0, worker="w2", status="error", error_kind="http_5xx", end_s=0.05)
    b.add_request(
        sent_s=19.9, **s0, worker="w1", chunks=[(0.05, 1), (0.3, 1)], end_s=0.35, prompt_tokens=130
    )
    # step 1
    s1 = {"step": 1, "concurrency": 4}
    b.add_request(sent_s=21.5, **s1, worker="w1", chunks=[(0.6, 1), (0.8, 1)], end_s=0.9)
    b.add_request(sent_s=23.0, **s1, worker="w2", chunks=[(0.1, 3), (0.3, 2)], end_s=0.3)
    b.add_request(
        sent_s=24.0,
        **s1,
        worker="w1",
        chunks=[(0.1, 1)],
        end_s=0.2,
        status="cancelled",
        error_kind="cancelled",
    )
    b.add_request(
        sent_s=25.0,
        **s1,
        worker="w2",
        chunks=[(0.2, 1), (0.3, 1)],
        end_s=0.4,
        status="error",
        error_kind="stream_error",
    )
    b.add_request(sent_s=29.8, **s1, worker="w1", chunks=[(0.1, 1), (0.25, 1)], end_s=0.3)
    # step 2: failures only
    s2 = {"step": 2, "concurrency": 8}
    b.add_request(
        sent_s=31.0, **s2, worker="w1", status="error", error_kind="queue_rejected", end_s=0.01
    )
    b.add_request(sent_s=32.0, **s2, worker="w2", status="error", error_kind="connect", end_s=0.02)
    return b


def session_run(run_id: str = "sessions") -> RunBuilder:
    """The hand-computed sessions run of tests/integration/test_report_sessions.py.

    Step 0 (c=2): window [0, 20] s. Step 1 (c=2): window [20, 40] s. Every prompt asked for
    100 new tokens; turn 0 came out at exactly 100, later turns resend history (+40, +100).
    - s-complete (w1, 1.0 s): a user turn answered by a tool call (two tool_call chunks),
      its tool_result turn 0.5 s later, a second user turn 2.0 s after that: complete.
    - s-error (w2, 2.0 s): turn 1 fails (http_5xx): error.
    - s-cut (w1, 5.0 s): turn 1 aborted by the run's end: cut.
    - s-missing (w2, 6.0 s): 3 turns planned, one sent (no cached_tokens reported): cut.
    - s-no-result (w1, 8.0 s): a tool call never followed by its tool_result: cut.
    - s-late (w2, 21.0 s): step 1, one turn: complete.
    """
    b = RunBuilder(run_id, workers=("w1", "w2"))
    b.add_step(0, 2, started_s=0, spawned_s=0, ended_s=20)
    b.add_step(1, 2, started_s=20, spawned_s=20, ended_s=40)
    s0 = {"step": 0, "concurrency": 2}
    b.add_session("s-complete", started_s=1.0, planned=2, worker="w1", **s0, turns=[
        {"chunks": [(0.2, 3, "tool_call"), (0.3, 2, "tool_call")], "end_s": 0.35,
         "tool_calls": 1, "prompt_tokens": 100, "cached_tokens": 0},
        {"kind": "tool_result", "wait_s": 0.5, "chunks": [(0.1, 2), (0.2, 2)], "end_s": 0.25,
         "prompt_tokens": 140, "cached_tokens": 96},
        {"wait_s": 2.0, "chunks": [(0.05, 1), (0.15, 1)], "end_s": 0.2, "prompt_tokens": 200,
         "cached_tokens": 128},
    ], history_per_turn=50)  # fmt: skip
    b.add_session("s-error", started_s=2.0, planned=3, worker="w2", **s0, turns=[
        {"chunks": [(0.3, 2)], "end_s": 0.4, "prompt_tokens": 100, "cached_tokens": 0},
        {"wait_s": 1.0, "status": "error", "error_kind": "http_5xx", "end_s": 0.05},
    ])  # fmt: skip
    b.add_session("s-cut", started_s=5.0, planned=2, worker="w1", **s0, turns=[
        {"chunks": [(0.1, 1), (0.2, 1)], "end_s": 0.25, "prompt_tokens": 100,
         "cached_tokens": 0},
        {"wait_s": 0.5, "status": "aborted", "error_kind": "aborted", "chunks": [(0.1, 1)],
         "end_s": 0.15},
    ])  # fmt: skip
    b.add_session("s-missing", started_s=6.0, planned=3, worker="w2", **s0, turns=[
        {"chunks": [(0.4, 1)], "end_s": 0.5, "prompt_tokens": 100},
    ])  # fmt: skip
    b.add_session("s-no-result", started_s=8.0, planned=1, worker="w1", **s0, turns=[
        {"chunks": [(0.2, 2, "tool_call")], "end_s": 0.3, "tool_calls": 1,
         "prompt_tokens": 100, "cached_tokens": 0},
    ])  # fmt: skip
    b.add_session("s-late", started_s=21.0, planned=1, worker="w2", step=1, concurrency=2,
                  turns=[{"chunks": [(0.25, 2)], "end_s": 0.3, "prompt_tokens": 100,
                          "cached_tokens": 64}])  # fmt: skip
    return b
