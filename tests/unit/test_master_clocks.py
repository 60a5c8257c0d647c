"""The master's run coordinator: worker clock offsets (NTP-style), probes and sink losses in the
manifest. A fake runner stands in for Locust's; the manifest goes to a local store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
import pytest

from locustfiles.master import clocks
from locustfiles.master.clocks import CLOCK_BURST
from locustfiles.master.coordinator import RunCoordinator
from locustfiles.options.options import OPTIONS, from_parsed
from locustfiles.run.protocol import MSG_CLOCK, MSG_CLOCK_OFFSET, kernel_boot_id

MS = 1_000_000
T1 = 1_700_000_000_000 * MS


class FakeRunner:
    """What the coordinator uses of a MasterRunner: messages, clients, stats."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, str | None]] = []
        self.clients = SimpleNamespace(all=[], missing=[])
        self.stats = SimpleNamespace(total=SimpleNamespace(num_requests=0))

    def send_message(self, msg_type: str, data: Any = None, client_id: str | None = None) -> None:
        self.sent.append((msg_type, data, client_id))


def coordinator(tmp_path: Path, **extra: Any) -> tuple[RunCoordinator, FakeRunner]:
    values = {flag.lstrip("-").replace("-", "_"): kw.get("default") for flag, kw in OPTIONS}
    values.update(events_uri=str(tmp_path / "events"), finish_timeout=0.1, **extra)
    options = from_parsed(argparse.Namespace(**values))
    runner = FakeRunner()
    environment = SimpleNamespace(runner=runner, host="http://127.0.0.1:9")
    return RunCoordinator(environment, options, "r1"), runner


def exchange(
    c: RunCoordinator, worker: str, skew_ms: float, out_ms: float, back_ms: float, t1: int = T1
) -> None:
    """One exchange with a worker whose clock is `skew_ms` ahead, over the given delays."""
    t2 = t1 + int((out_ms + skew_ms) * MS)
    c.on_clock_reply(worker, {"t1": t1, "t2": t2}, t4=t1 + int((out_ms + back_ms) * MS))


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


def test_a_worker_on_the_masters_kernel_has_offset_zero_unless_its_clock_is_faked(
    tmp_path: Path,
) -> None:
    """Same boot id, one wall clock: an offset within the exchange's error (half its round
    trip) is that error, so 0. A clock faked for the process (libfaketime) is still seen."""
    c, _ = coordinator(tmp_path)
    boot = kernel_boot_id()
    assert boot  # Linux
    c.on_hello("same", {"worker_id": "w1", "host": "h", "pid": 7, "boot_id": boot})
    c.on_hello("other", {"worker_id": "w2", "host": "h2", "pid": 8, "boot_id": "elsewhere"})
    c.on_hello("faked", {"worker_id": "w3", "host": "h", "pid": 9, "boot_id": boot})
    exchange(c, "same", 0, out_ms=0.2, back_ms=0.8)  # the exchange's error: -0.3 ms
    exchange(c, "other", 0, out_ms=0.2, back_ms=0.8)
    exchange(c, "faked", 250, out_ms=0.2, back_ms=0.8)
    assert c.clocks["same"] == (0, 1 * MS)
    assert c.clocks["other"] == (-0.3 * MS, 1 * MS)  # another host: as measured
    assert c.clocks["faked"] == (249.7 * MS, 1 * MS)  # beyond the error: as measured


def test_hello_starts_a_burst_of_exchanges(tmp_path: Path) -> None:
    c, runner = coordinator(tmp_path)
    c.on_hello("client-1", {"worker_id": "w1", "host": "h", "pid": 7})
    gevent.sleep(0.5)  # the burst runs in its own greenlet
    pings = [(t, d, cid) for t, d, cid in runner.sent if t == MSG_CLOCK]
    assert len(pings) == CLOCK_BURST and {cid for *_, cid in pings} == {"client-1"}
    assert all(isinstance(d["t1"], int) for _, d, _ in pings)


def pings(runner: FakeRunner) -> list[tuple[int, str | None]]:
    """(t1, client id) of every clock exchange the master started, in order."""
    return [(d["t1"], cid) for t, d, cid in runner.sent if t == MSG_CLOCK]


def wait_for_pings(runner: FakeRunner, n: int) -> list[tuple[int, str | None]]:
    for _ in range(1000):  # 10 s at most
        if len(pings(runner)) >= n:
            return pings(runner)
        gevent.sleep(0.01)
    raise AssertionError(f"{len(pings(runner))} clock exchanges, expected {n}")


def test_after_the_burst_the_master_measures_periodically_and_keeps_the_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clocks, "CLOCK_INTERVAL_S", 0.05)
    c, runner = coordinator(tmp_path, scrape_interval=0)
    c.on_hello("client-1", {"worker_id": "w1", "host": "h", "pid": 7})
    burst = wait_for_pings(runner, CLOCK_BURST)
    gevent.sleep(0.2)  # the burst is over, and nothing follows it on its own
    assert pings(runner) == burst
    for t1, _ in burst:
        exchange(c, "client-1", 250, out_ms=2, back_ms=2, t1=t1)
    assert c.clocks["client-1"] == (250 * MS, 4 * MS)

    c.tick()  # the run starts (a master with workers): the periodic exchanges begin
    later = wait_for_pings(runner, CLOCK_BURST + 3)[CLOCK_BURST:]
    assert {cid for _, cid in later} == {"client-1"}
    assert [t1 for t1, _ in later] == sorted({t1 for t1, _ in later})  # new exchanges each time
    offsets = [d["offset_ns"] for t, d, _ in runner.sent if t == MSG_CLOCK_OFFSET]
    exchange(c, "client-1", 300, out_ms=5, back_ms=1, t1=later[0][0])  # slower: ignored
    assert c.clocks["client-1"] == (250 * MS, 4 * MS)
    exchange(c, "client-1", 300, out_ms=0.5, back_ms=0.5, t1=later[1][0])  # faster: kept
    assert c.clocks["client-1"] == (300 * MS, 1 * MS)
    exchange(c, "client-1", 100, out_ms=1, back_ms=1, t1=later[2][0])  # slower again: ignored
    assert c.clocks["client-1"] == (300 * MS, 1 * MS)
    sent = [d["offset_ns"] for t, d, _ in runner.sent if t == MSG_CLOCK_OFFSET]
    assert sent[len(offsets) :] == [300 * MS]  # the worker is told its new offset, once

    c.finish()  # ends the periodic exchanges
    gevent.sleep(0.01)
    done = len(pings(runner))
    gevent.sleep(0.2)
    assert len(pings(runner)) == done


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
