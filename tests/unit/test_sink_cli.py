"""`llmload upload-spool` and `llmload store`: arguments and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli import main


def test_upload_spool_needs_an_events_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LLMLOAD_EVENTS_URI", raising=False)
    assert main(["upload-spool", str(tmp_path)]) == 2
    assert "--events-uri" in capsys.readouterr().err


def test_upload_spool_of_a_missing_dir_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["upload-spool", str(tmp_path / "nope"), "--events-uri", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_upload_spool_of_an_empty_spool_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["upload-spool", str(tmp_path), "--events-uri", str(tmp_path / "s")]) == 0
    assert "0 worker spool(s)" in capsys.readouterr().out


def test_store_help_documents_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["store", "--help"])
    out = capsys.readouterr().out
    for option in ("--dir", "--port", "--bucket"):
        assert option in out


def test_store_refuses_a_busy_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["store", "--dir", str(tmp_path), "--port", str(port)]) == 2
    assert "in use" in capsys.readouterr().err
