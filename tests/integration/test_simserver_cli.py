"""`python -m infra.simserver` / `llmload sim` as a process: port line, signals, bad flags."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.sim import chat_body, request, stream_request

ROOT = Path(__file__).resolve().parents[2]


def test_process_listens_serves_and_exits_cleanly(tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infra.simserver",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--truth-log",
            str(truth),
        ],  # fmt: skip
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+) \(simulated", line)
        assert match, line
        port = int(match.group(1))
        assert int(port_file.read_text()) == port
        assert json.loads(request(port, "GET", "/version")[2])["simulated"] is True
        stream = stream_request(port, chat_body(max_tokens=3, ignore_eos=True),
                                headers={"X-Request-Id": "cli-1"})  # fmt: skip
        assert stream.complete
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
    records = [json.loads(line) for line in truth.read_text().splitlines()]
    assert [r["request_id"] for r in records] == ["cli-1"]


def test_bad_flags_exit_2_with_one_line() -> None:
    for flags in (["--tokens-per-event", "0"], ["--no-such-flag"], ["--profile", "huge"],
                  ["--fault-drop-rate", "2"], ["--port", "x"]):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "infra", "sim", *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (flags, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stdout == ""
