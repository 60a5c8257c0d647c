"""A leading `~` in local paths is expanded the same way everywhere (or refused with the fix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.kernel.errors import UsageError
from analysis.kernel.storage import FileStore, expand_home, open_store
from locustfiles.options.table import OPTION
from locustfiles.traffic.workloads import parse_workload


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_expand_home(home: Path) -> None:
    assert expand_home("~/runs", "events URI") == f"{home}/runs"
    assert expand_home("runs/~x", "events URI") == "runs/~x"  # only a leading ~
    with pytest.raises(UsageError, match="~llmload-nobody names no home folder"):
        expand_home("~llmload-nobody/runs", "events URI")


def test_report_and_spool_dirs_are_expanded(home: Path) -> None:
    for name in ("report_dir", "spool_dir"):
        option = OPTION[name]
        assert option.kind.value("~/x", option.cli()) == f"{home}/x"
        assert option.kind.value("", option.cli()) == ""  # the default stays the default


def test_a_local_events_uri_is_expanded(home: Path) -> None:
    store = open_store("~/runs")
    assert isinstance(store, FileStore) and store.root == home / "runs"
    # file://~/runs was a folder named "~" in the current directory (issue 36)
    for uri in ("file://~/runs", "file://~/runs/"):
        store = open_store(uri)
        assert isinstance(store, FileStore) and store.root == home / "runs"
        assert store.uri == (home / "runs").as_uri()  # what a report command is given
    other = open_store("file:///abs/runs")
    assert isinstance(other, FileStore) and other.root == Path("/abs/runs")
    relative = open_store("file://./rel")
    assert isinstance(relative, FileStore) and relative.root == Path("rel")


def test_dataset_path_is_expanded(home: Path) -> None:
    (home / "d.jsonl").write_text('{"prompt": "hi", "max_tokens": 3}\n')
    spec = parse_workload("dataset:~/d.jsonl").sampler(1).sample()
    assert (spec.prompt_text, spec.max_tokens) == ("hi", 3)


def test_a_campaigns_report_dir_is_expanded(home: Path) -> None:
    from infra.campaign.config import parse_campaign

    data = {"target": {"url": "http://127.0.0.1:9"}, "workload": "D(16,8)", "report_dir": "~/r"}
    assert parse_campaign(data, source="c.yaml").report_dir == f"{home}/r"
