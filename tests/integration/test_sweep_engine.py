"""An engine configuration's process: started, found not ready, stopped, its port checked
free (infra/campaign/engine.py): real processes, real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.campaign.config import parse_campaign
from infra.campaign.engine import EngineProcess, EngineStartError


def _campaign(**engine: Any) -> Any:
    return parse_campaign({"target": {}, "workload": "D(16,8)", "engine": engine})


def _engine(tmp_path: Path, command: list[str], **more: Any) -> EngineProcess:
    campaign = _campaign(command=command, ready_timeout=more.pop("ready_timeout", 10), **more)
    return EngineProcess(campaign.engine, campaign.engine.plan()[0], tmp_path)


def test_an_engine_that_exits_or_never_answers_fails_its_start(tmp_path: Path) -> None:
    code = "import sys; print('bad flag', flush=True); sys.exit(3)"
    with _engine(tmp_path, [sys.executable, "-c", code, "{port}"]) as engine:
        with pytest.raises(EngineStartError, match="exited with status 3"):
            engine.start()
        assert "bad flag" in engine.log_tail()
    silent = [sys.executable, "-c", "import time; time.sleep(30)", "{port}"]
    with (
        _engine(tmp_path, silent, ready_timeout=1) as engine,
        pytest.raises(EngineStartError, match="did not answer 200 within 1 s"),
    ):
        engine.start()
    assert engine.crashed  # stopped with its group when the block ended


def test_an_engine_is_stopped_and_its_port_checked_free(tmp_path: Path) -> None:
    server = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "{port}"]
    with _engine(tmp_path, server, ready_path="/") as engine:
        engine.start()
        assert engine.startup_s is not None and engine.launch_args.startswith(sys.executable)
        port = engine.port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    # a port someone else holds is refused before anything starts
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with (
            _engine(tmp_path, server, port=taken, ready_path="/") as engine,
            pytest.raises(EngineStartError, match="already taken"),
        ):
            engine.start()
