"""Start-up fails fast and clearly in every mode (issue 11): distributed, headless, web UI.

A worker that cannot start (here: its tokenizer is missing on its host) tells the master,
which stops the run with one line naming that worker and the cause and exits non-zero,
well before the run's planned end. Headless and web UI runs refuse to start on a target
that does not answer, with one line (headless) or a message in the start form (web UI).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from infra.ports import free_port
from tests.support.chat import (
    BIN,
    LOCUSTFILE,
    ROOT,
    LocustResult,
    reap,
    run_locust,
    start_master,
    start_sim,
    start_worker,
)


def word_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from locustfiles.traffic.prompts import _WORDS

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(_WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.parent.mkdir(parents=True)
    tok.save(str(path))


def test_a_worker_without_its_tokenizer_stops_the_run_naming_it(tmp_path: Path) -> None:
    here, elsewhere = tmp_path / "host-a", tmp_path / "host-b"
    word_tokenizer(here / "tok" / "tokenizer.json")  # relative path: found on host-a only
    elsewhere.mkdir()
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with start_sim(tmp_path / "sim") as sim:
        master = start_master(port, sim.url, tmp_path, "--tokenizer", "tok/tokenizer.json",
                              workers=2, env=env, cwd=here)  # fmt: skip
        workers = [start_worker(port, env, cwd) for cwd in (here, elsewhere)]
        start = time.monotonic()
        try:
            out, _ = master.communicate(timeout=60)
            elapsed = time.monotonic() - start
            worker_out = [w.communicate(timeout=30)[0] for w in workers]
        finally:
            for proc in (master, *workers):
                reap(proc)  # its pipe too, whatever happened above
    errors = [line for line in out.splitlines() if line.startswith("llmload: error:")]
    assert master.returncode == 2, out
    assert len(errors) == 1, out
    assert "cannot load tokenizer 'tok/tokenizer.json'" in errors[0]
    assert "the run is stopped" in errors[0] and " cannot start: " in errors[0]
    failed = [w for w, o in zip(workers, worker_out, strict=True) if "cannot start" in o]
    assert len(failed) == 1 and failed[0] is workers[1]  # the worker on host-b, named
    assert workers[1].returncode != 0
    worker_id = errors[0].split("worker ", 1)[1].split(" ", 1)[0]
    assert worker_id in worker_out[1]
    assert elapsed < 30, elapsed  # the run was planned for 2 x 60 s
    assert "did not confirm their events" not in out  # the other worker's events: flushed


def test_headless_refuses_a_target_that_does_not_answer_before_any_request(
    tmp_path: Path,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run(
        [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--host", dead,
         "--events-uri", str(tmp_path / "runs"), "--steps", "1", "--step-duration", "5",
         "--step-warmup", "1"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    errors = [line for line in out.stderr.splitlines() if line.startswith("llmload: error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr
    assert f"target {dead} did not answer" in errors[0] and "--wait-ready" in errors[0]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()  # nothing written


def test_wait_ready_waits_for_a_target_that_is_still_starting(tmp_path: Path) -> None:
    """--wait-ready 30: the first probes fail (nothing answers yet); the simulator starts on
    that port ~2 s later, and the run goes ahead and records its requests."""
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(60)
    run = subprocess.Popen(
        [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
         "--host", f"http://127.0.0.1:{port}", "--wait-ready", "30",
         "--events-uri", str(tmp_path / "runs"), "--spool-dir", str(tmp_path / "spool"),
         "--steps", "1", "--step-duration", "2", "--step-warmup", "0", "--cold-requests", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        # The run's first probe reaches a server that is not ready: the connection is reset
        # without an answer (SO_LINGER 0), so the run has really started waiting.
        with listener:
            probe, _ = listener.accept()
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            probe.close()
        time.sleep(2)  # refused meanwhile: nothing listens
        with start_sim(tmp_path / "sim", "--port", str(port)) as sim:
            assert sim.port == port
            out, _ = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, out
    assert "llmload: error:" not in out and "Traceback" not in out, out
    requests, _, manifest = LocustResult(run.returncode, out, tmp_path / "runs").events()
    statuses = requests["status"].value_counts().to_dict()
    assert statuses.get("ok", 0) > 0 and set(statuses) <= {"ok", "aborted"}, statuses
    preflight = [p for p in manifest["probes"] if p["purpose"] == "preflight"]
    assert [p["http_status"] for p in preflight] == [200], manifest["probes"]


def test_web_ui_shows_the_problem_and_does_not_start(tmp_path: Path) -> None:
    web = free_port()
    dead = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--web-host", "127.0.0.1", "--web-port",
         str(web), "--host", dead, "--events-uri", str(tmp_path / "runs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{web}/", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)
        form = {"user_count": "1", "spawn_rate": "1", "host": dead, "steps": "1",
                "step_duration": "5", "step_warmup": "1"}  # fmt: skip
        req = urllib.request.Request(
            f"http://127.0.0.1:{web}/swarm", data=urllib.parse.urlencode(form).encode()
        )
        answer = json.loads(urllib.request.urlopen(req, timeout=30).read())
        assert answer["success"] is False
        assert answer["message"].startswith(f"llmload: target {dead} did not answer")
        state = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{web}/stats/requests", timeout=5).read()
        )
        assert state["state"] == "ready"  # not started
        # the same form against a bad option value names the option
        form["step_duration"] = "-1"
        req = urllib.request.Request(
            f"http://127.0.0.1:{web}/swarm", data=urllib.parse.urlencode(form).encode()
        )
        answer = json.loads(urllib.request.urlopen(req, timeout=30).read())
        assert answer["success"] is False and "--step-duration" in answer["message"]
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert not (tmp_path / "runs").exists()


# A worker whose start-up fails with an exception that is not an LlmloadError (here: building
# its WorkerContext raises OSError), in a process of its own with Locust's log levels.
UNEXPECTED_FAILURE = """
import argparse, logging, sys, types
logging.basicConfig(level=getattr(logging, sys.argv[2]), stream=sys.stderr)
import locustfiles.chat
from locustfiles.options.options import OPTIONS
from locustfiles.worker import side

def broken(*args, **kwargs):
    raise OSError(28, "No space left on device")

side.WorkerContext = broken
parsed = argparse.Namespace(**{f.lstrip("-").replace("-", "_"): o.get("default") for f, o in OPTIONS})
parsed.events_uri = sys.argv[1]
env = types.SimpleNamespace(
    runner=types.SimpleNamespace(quit=lambda: None), parsed_options=parsed,
    host="http://127.0.0.1:9",
)
worker = side.WorkerSide(env, None, lambda record: None)
worker.start()
assert env.process_exit_code == 2 and worker.context is None
"""


def test_an_unexpected_worker_start_up_error_is_one_line_with_the_traceback_at_debug(
    tmp_path: Path,
) -> None:
    def start_up(level: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", UNEXPECTED_FAILURE, str(tmp_path / "runs"), level],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stderr.splitlines()

    lines = start_up("INFO")
    named = [line for line in lines if "No space left on device" in line]
    assert len(named) == 1, lines
    assert named[0].startswith("llmload: error: worker ") and " cannot start: OSError: " in named[0]
    assert not [line for line in lines if "Traceback" in line or "ERROR" in line], lines
    debug = "\n".join(start_up("DEBUG"))
    assert "llmload: worker start-up failed\nTraceback (most recent call last):" in debug
    assert "OSError: [Errno 28] No space left on device" in debug


@pytest.mark.parametrize("workers", [0, 2], ids=["local", "two-workers"])
def test_a_run_whose_first_requests_are_all_refused_stops_instead_of_flooding(
    tmp_path: Path, workers: int
) -> None:
    """The preflight's short request passes, but every request of the dataset is longer
    than the server's context (HTTP 400): the first REFUSED_AT_START refusals stop the run
    with the server's message, well before its planned 2 x 60 s, every request sent kept."""
    dataset = tmp_path / "long.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": "word " * (120 + i)}) + "\n"
                               for i in range(20)))  # fmt: skip
    with start_sim(tmp_path / "sim", "--max-model-len", "64") as sim:
        start = time.monotonic()
        result = run_locust(sim.url, tmp_path / "runs", "--workload", f"dataset:{dataset}",
                            "--steps", "2,4", "--step-duration", "60", "--step-warmup", "0",
                            "--cold-requests", "0", workers=workers, timeout=90)  # fmt: skip
        elapsed = time.monotonic() - start
    errors = [line for line in result.output.splitlines() if line.startswith("llmload: error:")]
    assert result.returncode == 2, result.output
    assert errors and all(" cannot start: the target refused its first 5 requests (last: "
                          "HTTP 400: " in line for line in errors), result.output  # fmt: skip
    assert "maximum context length" in errors[0] or "max_model_len" in errors[0], errors[0]
    assert "Traceback" not in result.output
    assert elapsed < 40, elapsed
    requests, _, manifest = result.events()
    assert manifest["status"] == "aborted"
    refused = requests[requests["status"] == "error"]
    assert len(refused) >= 5 and (refused["error_kind"] == "http_4xx_input").all()
    assert len(requests) < 500, len(requests)  # stopped, not a flood
    assert not (requests["status"] == "ok").any()


def test_a_run_that_sent_no_request_fails_naming_why(tmp_path: Path) -> None:
    """A target so slow (every request ~4 s) that the worker's start-up probes outlast the
    one 2 s step: no request of the load was sent, so the run is no result (exit 1, one
    line), not a finished run of zeros (it exited 0)."""
    with start_sim(tmp_path / "sim", "--time-scale", "4000") as sim:
        result = run_locust(sim.url, tmp_path / "runs", "--steps", "1", "--step-duration", "2",
                            "--step-warmup", "0", "--cold-requests", "0", timeout=120)  # fmt: skip
    errors = [line for line in result.output.splitlines() if line.startswith("llmload: error:")]
    assert result.returncode == 1, result.output
    assert len(errors) == 1 and ": no request was sent before the steps ended" in errors[0], errors
    assert "give longer steps (--step-duration)" in errors[0]
    assert "Traceback" not in result.output
    requests, _, manifest = result.events()
    assert len(requests) == 0
    assert any(p["purpose"] == "first_request" for p in manifest["probes"])
