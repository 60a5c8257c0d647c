"""A full disk under a real run (issue 20 item 7): the events folder or the spool is a small
tmpfs, filled by the test once the run is going. Each table gets one clear line (not a
traceback per part), no table's rows are lost while the process lives, and the end names
what was kept in the spool (and the command to send it) or lost, with exit status 1.

Needs root (mount); skipped with that reason otherwise."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.chat import (
    BIN,
    LOCUSTFILE,
    assert_no_answered_request_lost,
    reap,
    start_sim,
    wait_for,
)

pytestmark = pytest.mark.slow  # long (10-35 s a test): `make test-slow`

TABLES = ("requests", "chunks", "samples", "stalls")
RUN = ("--step-warmup", "0", "--cold-requests", "0", "--workload", "D(16,64)")


@contextmanager
def tmpfs(folder: Path, size: str = "2m") -> Iterator[Path]:
    """A small tmpfs mounted on `folder` for the test (skipped where it cannot be)."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is a small tmpfs the test mounts: needs root")
    folder.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode:
        pytest.skip(f"cannot mount a tmpfs on {folder}: {out.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Fill `folder`'s file system to the last byte; returns the filler (delete it: space back)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, bytes(size))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def start_run(sim_url: str, events: Path, spool: Path, log: Path, *args: str) -> subprocess.Popen:
    """A headless single-process run, its output (stdout and stderr) to `log`."""
    cmd = [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "--host", sim_url, "--events-uri", str(events), "--spool-dir", str(spool), *RUN, *args]  # fmt: skip
    with log.open("w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


def refused(output: str, where: str) -> dict[str, int]:
    """Per table, the lines saying its part cannot be written to `where` (spool, events store)."""
    return {
        table: len(re.findall(rf"llmload: cannot write the {table} table to the {where} ", output))
        for table in TABLES
    }


def rows_in(run: Path, table: str) -> int:
    return sum(pq.read_metadata(f).num_rows for f in (run / table).rglob("*.parquet"))


def tracebacks(output: str) -> list[str]:
    """The log records (or bare lines) that hold a traceback, each as its first line."""
    records = re.split(r"\n(?=\[\d{4}-\d\d-\d\d |\S+Z \()", output)
    return [r.splitlines()[0] for r in records if "Traceback" in r]


def test_a_full_events_folder_keeps_every_table_in_the_spool_and_fails_the_run(
    tmp_path: Path,
) -> None:
    events, spool, log = tmp_path / "runs", tmp_path / "spool", tmp_path / "locust.log"
    with tmpfs(events), start_sim(tmp_path / "sim", "--decode-base-ms", "5") as sim:
        run = start_run(sim.url, events, spool, log, "--steps", "2,4", "--step-duration", "6",
                        "--finish-timeout", "5")  # fmt: skip
        try:
            wait_for(lambda: len(sim.truth()) >= 5, 60, "requests answered by the simulator")
            filler = fill(events)
            run.wait(90)
        finally:
            reap(run)
        output = log.read_text()
        truth = sim.truth()
        assert run.returncode == 1, output[-3000:]
        (run_dir,) = [p for p in spool.iterdir() if p.is_dir()]
        run_id = run_dir.name
        kept = {table: rows_in(run_dir, table) for table in TABLES}
        assert kept["requests"] >= len(truth) > 0 and kept["chunks"] and kept["samples"]
        assert not any(rows_in(events / run_id, table) for table in TABLES)
        # one line per table that has rows, however many parts and retries
        assert refused(output, "events store") == {t: int(n > 0) for t, n in kept.items()}
        line = next(x for x in output.splitlines() if "cannot write the requests table" in x)
        assert (
            f"events store {events.as_uri()}: no space left on device; its parts are kept "
            f"in the spool {spool} and retried" in line
        )
        command = f"`llmload upload-spool {spool} --events-uri {events}`"
        (summary,) = [x for x in output.splitlines() if "event sink wrote" in x and "WARNING" in x]
        assert f"NOT UPLOADED: {sum(kept.values())} rows in " in summary and command in summary
        named = re.search(r"\(requests: \d+ parts?, (\d+) rows; chunks: ", summary)
        assert named and int(named.group(1)) == kept["requests"], summary
        errors = [x for x in output.splitlines() if x.startswith("llmload: error: run ")]
        (error,) = [x for x in errors if "events are incomplete in the store" in x]
        assert f"run {run_id}: worker " in error and command in error
        (manifest,) = [x for x in errors if x != error]  # the master's own write, said once
        assert f"run {run_id}: its final manifest is not in the events store " in manifest
        assert "no space left on device" in manifest.lower(), manifest
        assert sum("could not write the manifest" in x for x in output.splitlines()) == 1
        assert not tracebacks(output), output[-3000:]  # the sink's, the master's: none

        # space back: upload-spool sends every part; the store then holds every answered request
        filler.unlink()
        sent = subprocess.run([str(BIN / "llmload"), "upload-spool", str(spool), "--events-uri",
                               str(events)], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert_no_answered_request_lost(events / run_id, truth)
        assert {t: rows_in(events / run_id, t) for t in TABLES} == kept


def test_a_full_spool_keeps_the_rows_in_memory_until_space_comes_back(tmp_path: Path) -> None:
    events, spool, log = tmp_path / "runs", tmp_path / "spool", tmp_path / "locust.log"
    with tmpfs(spool), start_sim(tmp_path / "sim", "--decode-base-ms", "5") as sim:
        run = start_run(sim.url, events, spool, log, "--steps", "2,4", "--step-duration", "8")
        try:
            wait_for(lambda: len(sim.truth()) >= 5, 60, "requests answered by the simulator")
            filler = fill(spool)
            # the first parts are sealed ~10 s in: each table says so once, its rows wait
            wait_for(lambda: refused(log.read_text(), "spool")["samples"], 30, "a full spool")
            filler.unlink()
            run.wait(90)
        finally:
            reap(run)
        output = log.read_text()
        truth = sim.truth()
    assert run.returncode == 0, output[-3000:]
    (run_dir,) = [p for p in events.iterdir() if p.is_dir()]
    stored = {table: rows_in(run_dir, table) for table in TABLES}
    counts = refused(output, "spool")  # (a worker's loop may not stall before space is back)
    assert counts["requests"] == counts["chunks"] == counts["samples"] == 1 >= counts["stalls"]
    assert stored["chunks"] and stored["samples"], stored
    line = next(x for x in output.splitlines() if "cannot write the chunks table" in x)
    assert f"to the spool {spool}: no space left on device; its rows are kept in memory" in line
    assert "written to the spool again" in output
    assert "Traceback" not in output and "LOST" not in output and "NOT UPLOADED" not in output
    assert_no_answered_request_lost(run_dir, truth)


def test_rows_a_full_spool_refuses_to_the_end_are_counted_lost_and_fail_the_run(
    tmp_path: Path,
) -> None:
    events, spool, log = tmp_path / "runs", tmp_path / "spool", tmp_path / "locust.log"
    with tmpfs(spool), start_sim(tmp_path / "sim", "--decode-base-ms", "5") as sim:
        run = start_run(sim.url, events, spool, log, "--steps", "2", "--step-duration", "4",
                        "--finish-timeout", "3")  # fmt: skip
        try:
            wait_for(lambda: len(sim.truth()) >= 5, 60, "requests answered by the simulator")
            fill(spool)
            run.wait(90)
        finally:
            reap(run)
        output = log.read_text()
        truth = sim.truth()
    assert run.returncode == 1, output[-3000:]
    counts = refused(output, "spool")
    assert counts["requests"] == counts["chunks"] == counts["samples"] == 1, counts
    (summary,) = [x for x in output.splitlines() if "event sink wrote" in x and "WARNING" in x]
    lost = dict(
        (t, int(n)) for n, t in re.findall(r"(\d+) (\w+) rows", summary.split("LOST at exit: ")[1])
    )
    assert lost["requests"] >= len(truth) > 0 and lost["chunks"] and lost["samples"]
    (error,) = [x for x in output.splitlines() if x.startswith("llmload: error: run ")]
    assert (
        f"{lost['requests']} requests rows" in error
        and "were lost (never written to its spool" in error
    )
    assert "Traceback" not in output, output[-3000:]
    (run_dir,) = [p for p in events.iterdir() if p.is_dir()]
    assert not any(rows_in(run_dir, table) for table in TABLES)
