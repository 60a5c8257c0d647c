"""`llmload check` against the simulated engine: healthy, faulty, lax and late servers."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from infra.cli import main
from infra.ports import free_port
from tests.support.sim import SimFactory
from tests.support.targets import TargetHandler, serving


def check(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", url, "--json", "--timeout", "10", *args])
    return code, json.loads(capsys.readouterr().out)


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in result["checks"]}


def test_every_check_passes_against_the_simulator(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = sim_factory()
    url = f"http://127.0.0.1:{sim.port}"
    code, result = check(capsys, url + "/")  # a trailing / is the same server (/v1 is refused)
    assert code == 0 and result["ok"] is True
    checks = by_name(result)
    assert list(checks) == ["non-streaming", "streaming", "bad input", "cancellation"]
    assert {c["status"] for c in checks.values()} == {"pass"}
    assert checks["bad input"]["data"] == {
        "prompt_words": 8192 + 64, "max_model_len": 8192, "http_status": 400,
    }  # fmt: skip
    cancel = checks["cancellation"]["data"]
    assert cancel["gauge"] == "vllm:num_requests_running"
    assert cancel["running_during"] == cancel["baseline"] + 1
    assert 0 <= cancel["release_s"] < 5
    learned = result["learned"]
    assert learned["model"] == "llmload-sim-tiny" and learned["max_model_len"] == 8192
    assert learned["simulated"] is True and learned["server_version"]
    assert learned["ignore_eos"] == "accepted" and learned["stream_options"] == "accepted"
    assert learned["usage_in_stream"] is True and learned["done_sent"] is True
    assert sim.metrics()["llmload_sim_requests_cancelled_total"] == 1

    assert main(["check", url, "--endpoint", "completions", "--running-metric",
                 "llmload_sim_requests_running"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "cancellation   pass" in text and "llmload_sim_requests_running 1 -> 0" in text
    assert "simulated        YES" in text and "all required checks passed" in text


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_every_check_passes_on_the_responses_and_messages_apis(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str], endpoint: str
) -> None:
    """The same four checks on the simulator's Responses and Messages APIs, their streams and
    bodies read by llmload's built-in adapters (docs/extending.md)."""
    sim = sim_factory()
    code, result = check(capsys, f"http://127.0.0.1:{sim.port}", "--endpoint", endpoint)
    assert code == 0 and result["ok"] is True, result
    checks = by_name(result)
    assert {c["status"] for c in checks.values()} == {"pass"}
    assert checks["non-streaming"]["data"]["completion_tokens"] == 16
    assert checks["bad input"]["data"]["http_status"] == 400
    assert checks["cancellation"]["data"]["running_during"] == (
        checks["cancellation"]["data"]["baseline"] + 1
    )
    learned = result["learned"]
    assert learned["ignore_eos"] == "accepted" and learned["usage_in_stream"] is True
    assert learned["stream_options"] == f"none ({endpoint} API)"
    assert sim.metrics()["llmload_sim_requests_cancelled_total"] == 1


def test_http_500_fails_the_request_checks(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = sim_factory("--fault-500-rate", "1")
    code, result = check(capsys, f"http://127.0.0.1:{sim.port}")
    assert code == 1 and result["ok"] is False
    checks = by_name(result)
    for name in ("non-streaming", "streaming"):
        assert checks[name]["status"] == "fail"
        assert checks[name]["detail"].startswith("HTTP 500"), checks[name]
    assert checks["streaming"]["data"]["http_status"] == 500
    assert checks["bad input"]["status"] == "pass"  # length is checked before the fault


def test_a_dropped_stream_fails_as_truncated(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = sim_factory("--fault-drop-rate", "1")
    code, result = check(capsys, f"http://127.0.0.1:{sim.port}")
    assert code == 1
    streaming = by_name(result)["streaming"]
    assert streaming["status"] == "fail"
    assert streaming["data"]["error_kind"] == "stream_truncated"
    assert streaming["data"]["done"] is False


def test_a_server_that_accepts_an_over_long_prompt_fails_the_bad_input_check(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # Launched with a context far beyond the model's 8k: a 20k-word prompt gets through.
    sim = sim_factory("--max-model-len", "1000000")
    code, result = check(capsys, f"http://127.0.0.1:{sim.port}", "--bad-input-words", "20000")
    assert code == 1
    bad = by_name(result)["bad input"]
    assert bad["status"] == "fail" and "accepted a 20000-word prompt" in bad["detail"]
    assert [c["status"] for c in result["checks"] if c["name"] != "bad input"] == ["pass"] * 3


def test_without_metrics_the_cancellation_is_not_verified(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = sim_factory()
    url = f"http://127.0.0.1:{sim.port}"
    code, result = check(capsys, url, "--metrics-url", url + "/no-metrics")
    assert code == 0  # not verifiable is not a failure
    cancel = by_name(result)["cancellation"]
    assert cancel["status"] == "skip" and "HTTP 404" in cancel["detail"]
    assert result["learned"]["running_gauge"] is None


def test_wait_ready_measures_a_late_server(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    starter = threading.Thread(
        target=lambda: (time.sleep(1.0), sim_factory("--port", str(port))), daemon=True
    )
    starter.start()
    try:
        code, result = check(
            capsys, f"http://127.0.0.1:{port}", "--wait-ready", "--ready-timeout", "20"
        )
    finally:
        starter.join(15)
    assert code == 0, result
    ready = by_name(result)["ready"]
    assert ready["status"] == "pass" and ready["data"]["tries"] > 1
    assert 0.8 < result["learned"]["ready_s"] < 15
    assert result["learned"]["models_ready_s"] is not None
    assert result["learned"]["model"] == "llmload-sim-tiny"


def test_wait_ready_gives_up(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, result = check(capsys, url, "--wait-ready", "--ready-timeout", "0.5")
    assert code == 1
    assert [(c["name"], c["status"]) for c in result["checks"]] == [("ready", "fail")]
    assert "connect" in result["checks"][0]["detail"]


def test_an_unreachable_server_fails_without_waiting(capsys: pytest.CaptureFixture[str]) -> None:
    code, result = check(capsys, f"http://127.0.0.1:{free_port()}")
    assert code == 1
    assert [c["status"] for c in result["checks"]] == ["fail", "skip", "skip", "skip"]
    assert result["checks"][0]["detail"].startswith("cannot reach the server: connect")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["not-a-url"], "is not an http(s) URL"),
        (["ftp://127.0.0.1:21"], "is not an http(s) URL"),
        (["http://127.0.0.1:99999"], "invalid port"),
        (["http://127.0.0.1:8000", "--ready-timeout", "5"], "--ready-timeout needs --wait-ready"),
        (["http://127.0.0.1:8000", "--timeout", "0"], "--timeout must be > 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["check", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err


def test_wait_ready_refuses_a_model_the_server_does_not_serve_at_once(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # The server answers and refuses the model (404): waiting cannot help, so --wait-ready
    # ends at its first answer with the line a check without --wait-ready prints.
    sim = sim_factory()
    url = f"http://127.0.0.1:{sim.port}"
    assert main(["check", url, "--model", "nope"]) == 2
    out, without = capsys.readouterr()
    began = time.monotonic()
    code = main(["check", url, "--wait-ready", "--ready-timeout", "60", "--model", "nope"])
    elapsed = time.monotonic() - began
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err == without
    assert err == (
        f"llmload: error: --model 'nope' is not served by {url}: it serves 'llmload-sim-tiny'; "
        "give one of them (e.g. --model llmload-sim-tiny) or leave --model out for the first\n"
    )
    assert elapsed < 30, elapsed


class _OnlyPings(TargetHandler):
    """Lists a model, then answers every completion 200 and sends `: ping` until the client
    leaves: no token, ever (issue 36: `llmload check` printed nothing for 301 s)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for _ in range(600):  # bounded: a minute at most, the client leaves long before
                self.wfile.write(b"8\r\n: ping\n\n\r\n")
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass


def test_a_server_that_only_pings_is_two_announced_timeouts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with serving(_OnlyPings) as url:
        started = time.monotonic()
        code = main(["check", url, "--json", "--timeout", "2"])
        elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    checks = by_name(json.loads(captured.out))
    assert code != 0
    assert checks["non-streaming"]["status"] == "fail" and checks["non-streaming"]["timed_out"]
    assert checks["streaming"]["status"] == "fail" and checks["streaming"]["timed_out"]
    for name in ("bad input", "cancellation"):
        assert checks[name]["status"] == "skip"
        assert "answered neither request within --timeout 2 s" in checks[name]["detail"]
    said = [line for line in captured.err.splitlines() if line.startswith("llmload check: ")]
    assert said[:2] == ["llmload check: non-streaming: fail", "llmload check: streaming: fail"]
    assert elapsed < 30  # bounded: two timeouts of 2 s, not 5 x --timeout
