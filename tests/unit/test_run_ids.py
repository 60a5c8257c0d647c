"""A run id names one run: a manifest is created once and never replaced by another run, an id
the store holds is refused at start, and the ids llmload makes itself skip taken ones."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis.kernel.errors import UsageError
from analysis.kernel.storage import FileStore, ObjectExistsError
from locustfiles.live.board import Board
from locustfiles.master.coordinator import RunCoordinator
from locustfiles.master.preflight import check_run_id, run_id_taken, write_first_manifest
from locustfiles.master.side import MasterSide
from locustfiles.options.options import OPTIONS, ChatOptions, from_parsed
from locustfiles.run.manifest import RunManifest, run_taken, write_manifest

ANOTHER_RUNS = b'{"run_id": "r1", "note": "another run\'s manifest"}\n'


def options(events: Path) -> ChatOptions:
    values = {flag.lstrip("-").replace("-", "_"): kw.get("default") for flag, kw in OPTIONS}
    values.update(events_uri=str(events), finish_timeout=0.1)
    return from_parsed(argparse.Namespace(**values))


def test_the_first_write_creates_and_later_writes_replace_only_their_own(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    mine = RunManifest("r1")
    write_manifest(store, mine)
    mine.finish()
    assert write_manifest(store, mine)["status"] == "finished"  # its own: replaced
    other = RunManifest("r1")
    with pytest.raises(ObjectExistsError):
        write_manifest(store, other)
    assert json.loads((tmp_path / "r1" / "manifest.json").read_text())["status"] == "finished"
    assert not other.stored


def test_a_run_is_taken_by_its_manifest_or_any_object_under_its_id(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.put("r1/manifest.json", ANOTHER_RUNS)
    store.put("r2/server_metrics/part-000000.jsonl", b"{}\n")  # events, no manifest
    assert run_taken(store, "r1") and run_taken(store, "r2")
    assert not run_taken(store, "r") and not run_taken(store, "r10")  # a prefix is not a run
    assert not run_taken(FileStore(tmp_path / "none"), "r1")


def test_preflight_refuses_a_taken_id_and_writes_nothing(tmp_path: Path) -> None:
    events = tmp_path / "ev"
    FileStore(events).put("r1/requests/worker=w/part-000000.parquet", b"x")
    with pytest.raises(UsageError) as refused:
        check_run_id(options(events), "r1")
    assert str(refused.value) == (
        f"run r1 already exists in the events store {events}; a run id names one run: "
        "choose another --run-id, or leave --run-id out for a generated one"
    )
    assert not (events / "r1" / "manifest.json").exists()
    check_run_id(options(events), "r2")  # free


def test_the_first_manifest_never_replaces_another_runs(tmp_path: Path) -> None:
    """Another master took the id between the check and the write: refused, left as it was."""
    events = tmp_path / "ev"
    FileStore(events).put("r1/manifest.json", ANOTHER_RUNS)
    with pytest.raises(UsageError, match="run r1 already exists in the events store"):
        write_first_manifest(options(events), "r1", "http://127.0.0.1:9")
    assert (events / "r1" / "manifest.json").read_bytes() == ANOTHER_RUNS


def test_a_store_that_cannot_say_leaves_the_verdict_to_the_write(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("a file, not a folder\n")
    assert run_id_taken(options(tmp_path / "f" / "ev"))("r1") is False


def coordinator(events: Path, *, manifest_stored: bool) -> RunCoordinator:
    runner = SimpleNamespace(send_message=lambda *a, **k: None,
                             clients=SimpleNamespace(all=[], missing=[]),
                             stats=SimpleNamespace(total=SimpleNamespace(num_requests=0)))  # fmt: skip
    environment = SimpleNamespace(runner=runner, host="http://127.0.0.1:9")
    return RunCoordinator(environment, options(events), "r1", manifest_stored=manifest_stored)


def test_the_coordinator_leaves_another_runs_manifest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run begun without its preflight (which refuses the id) still never overwrites."""
    events = tmp_path / "ev"
    FileStore(events).put("r1/manifest.json", ANOTHER_RUNS)
    run = coordinator(events, manifest_stored=False)
    with caplog.at_level(logging.ERROR, logger="llmload.master"):
        run._write()
        run._write()
    assert (events / "r1" / "manifest.json").read_bytes() == ANOTHER_RUNS
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "run r1 already exists in the events store" in errors[0]


def test_the_coordinator_replaces_the_manifest_its_preflight_created(tmp_path: Path) -> None:
    events = tmp_path / "ev"
    write_first_manifest(options(events), "r1", "http://127.0.0.1:9")
    run = coordinator(events, manifest_stored=True)
    run.manifest.finish("aborted")
    run._write()
    doc = json.loads((events / "r1" / "manifest.json").read_text())
    assert doc["status"] == "aborted"


def test_run_ids_skip_ids_the_store_or_this_process_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    side = MasterSide(None, Board())
    taken = {"base", "base-2", "gen-1"}
    assert side.choose_run_id("base", taken.__contains__) == "base"  # the preflight refuses it
    side.run_ids.add("base")  # a web UI's first run
    assert side.choose_run_id("base", taken.__contains__) == "base-3"  # -2 is in the store
    side.run_ids.add("base-3")
    assert side.choose_run_id("base", taken.__contains__) == "base-4"
    made = iter(["gen-1", "base", "gen-2"])
    monkeypatch.setattr("locustfiles.master.side.new_run_id", lambda: next(made))
    assert side.choose_run_id("", taken.__contains__) == "gen-2"  # taken, this process's: skipped


def test_a_campaign_regenerates_an_id_the_store_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra.campaign import runner

    FileStore(tmp_path).put("c-1/manifest.json", ANOTHER_RUNS)
    made = iter(["c-1", "c-2"])
    monkeypatch.setattr(runner, "new_run_id", lambda campaign, workload, label="": next(made))
    campaign = SimpleNamespace(events_uri=str(tmp_path))
    assert runner.free_run_id(campaign, None) == "c-2"  # type: ignore[arg-type]
