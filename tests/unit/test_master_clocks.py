"""The master's run coordinator: worker clock offsets (NTP-style), probes and sink losses in the
manifest. A fake runner stands in for Locust's; the manifest goes to a local store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent

from locustfiles.master import CLOCK_BURST, MSG_CLOCK, RunCoordinator
from locustfiles.options import OPTIONS, from_parsed

MS = 1_000_000
T1 = 1_700_000_000_000 * MS


class FakeRunner:
    """What the coordinator uses of a MasterRunner: messages, clients, stats."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, str | None]] = []
        self.clients = SimpleNamespace(all=[])
        self.stats = SimpleNamespace(total=SimpleNamespace(num_requests=0))

    def send_message(self, msg_type: str, data: Any = None, client_id: str | None = None) -> None:
        self.sent.append((msg_type, data, client_id))


def coordinator(tmp_path: Path) -> tuple[RunCoordinator, FakeRunner]:
    values = {flag.lstrip("-").replace("-", "_"): kw.get("default") for flag, kw in OPTIONS}
    values.update(events_uri=str(tmp_path / "events"), finish_timeout=0.1)
    options = from_parsed(argparse.Namespace(**values))
    runner = FakeRunner()
    environment = SimpleNamespace(runner=runner, host="http://127.0.0.1:9")
    return RunCoordinator(environment, options, "r1"), runner


def exchange(c: RunCoordinator, worker: str, skew_ms: float, out_ms: float, back_ms: float) -> None:
    """One exchange with a worker whose clock is `skew_ms` ahead, over the given delays."""
    t2 = T1 + int((out_ms + skew_ms) * MS)
    c.on_clock_reply(worker, {"t1": T1, "t2": t2}, t4=T1 + int((out_ms + back_ms) * MS))


def test_the_offset_of_the_shortest_round_trip_is_kept(tmp_path: Path) -> None:
    c, _ = coordinator(tmp_path)
    exchange(c, "w1", 250, out_ms=1, back_ms=3)  # asymmetric: off by (1 - 3) / 2 = -1 ms
    assert c.clocks["w1"] == (249 * MS, 4 * MS)
    exchange(c, "w1", 250, out_ms=0.5, back_ms=0.5)  # shorter: kept
    assert c.clocks["w1"] == (250 * MS, 1 * MS)
    exchange(c, "w1", 250, out_ms=9, back_ms=1)  # longer: ignored
    assert c.clocks["w1"] == (250 * MS, 1 * MS)
    c.on_clock_reply("w1", {"t1": "junk"}, t4=T1)  # malformed: ignored
    c.on_clock_reply("w2", {"t1": T1, "t2": T1}, t4=T1 - 1)  # master clock stepped back
    assert set(c.clocks) == {"w1"}


def test_hello_starts_a_burst_of_exchanges(tmp_path: Path) -> None:
    c, runner = coordinator(tmp_path)
    c.on_hello("client-1", {"worker_id": "w1", "host": "h", "pid": 7})
    gevent.sleep(0.5)  # the burst runs in its own greenlet
    pings = [(t, d, cid) for t, d, cid in runner.sent if t == MSG_CLOCK]
    assert len(pings) == CLOCK_BURST and {cid for *_, cid in pings} == {"client-1"}
    assert all(isinstance(d["t1"], int) for _, d, _ in pings)


def test_the_manifest_records_clocks_probes_and_sink_losses(tmp_path: Path) -> None:
    c, _ = coordinator(tmp_path)
    c.on_hello("client-1", {"worker_id": "w1", "host": "h", "pid": 7})
    c.on_hello("client-2", {"worker_id": "w2", "host": "h", "pid": 8})
    exchange(c, "client-1", 0.5, out_ms=0.2, back_ms=0.2)
    probe = {"request_id": "probe-1", "purpose": "ignore_eos", "http_status": 422,
             "outcome": "http 422", "worker_id": "w1"}  # fmt: skip
    c.add_probes([probe])  # by message right after probing...
    sink = {"rejected_rows": 3, "dropped_rows": 0, "errors": [f"bad row {i}" for i in range(9)]}
    c.on_finished("client-1", {"worker_id": "w1", "sink": sink, "probes": [probe]})  # ...and again
    c._write()
    doc = json.loads((tmp_path / "events" / "r1" / "manifest.json").read_text())
    w1, w2 = sorted(doc["workers"], key=lambda w: w["worker_id"])
    assert w1["clock_offset_ms"] == 0.5 and w1["clock_rtt_ms"] == 0.4
    assert (w1["rows_rejected"], w1["rows_dropped"]) == (3, 0)
    assert w1["sink_errors"] == [f"bad row {i}" for i in range(5)]
    assert w2["clock_offset_ms"] is None and w2["clock_rtt_ms"] is None  # never measured
    assert w2["rows_rejected"] is None and w2["sink_errors"] == []  # never reported
    assert doc["probes"] == [probe]
