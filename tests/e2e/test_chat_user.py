"""The chat user end to end: real Locust processes against the simulated engine.

The simulator's truth log says, per request id, what it sent and when; these tests hold the
events llmload recorded against it.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import build_report
from analysis.derive.metrics import compute_request_metrics
from tests.support.chat import run_locust, start_sim, unseen_by_server

STEPS = ("--step-duration", "2", "--step-warmup", "0.5")


def content_events(truth_row: dict) -> list[list[int]]:
    return [e for e in truth_row["events"] if e[1] > 0]


def test_headless_run_matches_the_servers_truth(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim", "--tokens-per-event", "1-3") as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--steps", "1,2", *STEPS, "--cold-requests", "2",
            "--workload", "0.5*D(24,12)+0.5*U(8,40)/(4,20)",
        )  # fmt: skip
        truth = sim.truth()
    assert result.returncode == 0, result.output
    requests, chunks, manifest = result.events()
    # No request lost or counted twice: ids match the server's log one to one.
    unseen_by_server(requests, truth)
    assert manifest["status"] == "finished" and manifest["target"]["simulated"] is True
    # Steps: exactly the cold requests, then both steps with their concurrency.
    assert (requests["cold"] == (requests["step"] == -1)).all()
    assert int(requests["cold"].sum()) == 2
    assert dict(requests.groupby("step")["concurrency"].first()) == {-1: 1, 0: 1, 1: 2}
    assert [s["concurrency"] for s in manifest["steps"]] == [1, 2]
    ok = requests[requests["status"] == "ok"].set_index("request_id")
    # none cut at the end: the last step's requests in flight finish before the run ends
    # (before, one stream per user was `aborted`, most often a long one)
    assert len(ok) == len(requests), requests["error_kind"].value_counts()
    # Forced output lengths (ignore_eos probed and accepted) and calibrated prompt lengths.
    assert (ok["completion_tokens"] == ok["max_tokens"]).all()
    assert (ok["prompt_tokens"] == ok["prompt_tokens_requested"]).all()
    assert (ok["output_tokens_source"] == "usage").all()
    # Multi-token events: every chunk's token count is what the server put in that event.
    by_req = chunks.sort_values(["request_id", "seq"]).groupby("request_id")["tokens"].apply(list)
    for rid in ok.index:
        assert by_req[rid] == [e[1] for e in content_events(truth[rid])], rid
    assert chunks["tokens"].max() == 3 and chunks["tokens"].min() == 1
    # Timing against the truth: client TTFT/E2E minus server-side offsets (loopback, low load).
    metrics = compute_request_metrics(ok.reset_index(), chunks).per_request.set_index(ok.index)
    server_ttft = pd.Series({rid: content_events(truth[rid])[0][0] / 1e9 for rid in ok.index})
    server_last = pd.Series({rid: content_events(truth[rid])[-1][0] / 1e9 for rid in ok.index})
    ttft_gap = metrics["ttft_s"] - server_ttft
    span_gap = (metrics["tpot_s"] * (ok["output_tokens"] - 1)) - (server_last - server_ttft)
    assert ttft_gap.min() > -0.0005  # the client cannot see a token before the server sends it
    assert ttft_gap.median() < 0.003 and ttft_gap.quantile(0.95) < 0.010
    assert span_gap.abs().median() < 0.003
    # The end of a response is the arrival of its last bytes: never before the last token.
    assert (ok["end_ns"] >= ok["last_token_ns"]).all()
    assert (ok["coalesced_events"] >= 0).all() and (ok["worker_stall_ns"] >= 0).all()
    # The worker measured itself: its samples are in the store and the report reads them.
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False, html=False)
    step = report.step_rows[-1]
    assert 0 < step["worker_cpu_max_pct"] < 400 and step["loop_lag_p99_ms"] >= 0
    assert report.completeness.rows_read["samples"] >= 3


def test_exact_prompt_lengths_with_a_tokenizer_and_token_counts_without_usage(
    tmp_path: Path,
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from locustfiles.traffic.prompts import _WORDS

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(_WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    with start_sim(tmp_path / "sim", "--tokens-per-event", "2") as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--steps", "2", *STEPS, "--cold-requests", "0",
            "--workload", "N(300,80)/(16,4)", "--tokenizer", str(tmp_path / "tokenizer.json"),
            "--continuous-usage", "off",
        )  # fmt: skip
    assert result.returncode == 0, result.output
    requests, chunks, _ = result.events()
    ok = requests[requests["status"] == "ok"]
    assert len(ok) > 10
    assert ok["prompt_tokens_requested"].nunique() > 5  # lengths really vary
    assert (ok["prompt_tokens"] == ok["prompt_tokens_requested"]).all()
    # Without continuous usage the tokenizer counts each event's text: 2 words, 2 tokens.
    assert (ok["output_tokens_source"] == "tokenizer").all()
    mine = chunks[chunks["request_id"].isin(ok["request_id"])]
    assert set(mine["tokens"]) <= {1, 2} and (mine["tokens"] == 2).mean() > 0.8
    sums = mine.groupby("request_id")["tokens"].sum()
    assert (sums == ok.set_index("request_id")["completion_tokens"].loc[sums.index]).all()


FAULTS = ("--fault-500-rate", "0.05", "--fault-drop-rate", "0.05", "--fault-malformed-rate", "0.05",
          "--fault-stall-rate", "0.05", "--stall-seconds", "1.5", "--fault-slow-header-rate", "0.05",
          "--slow-header-seconds", "1.5", "--max-model-len", "400", "--max-num-seqs", "4",
          "--max-waiting", "1")  # fmt: skip
KIND_OF_FAULT = {"error_500": "http_5xx", "drop": "stream_truncated", "malformed": "malformed_event",
                 "stall": "stall_timeout", "slow_header": "ttft_timeout"}  # fmt: skip


def test_every_failure_kind_is_recorded_with_its_cause(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim", *FAULTS) as sim:
        result = run_locust(
            sim.url, tmp_path / "runs", "--steps", "6", "--step-duration", "4", "--step-warmup", "0.5",
            "--cold-requests", "0", "--workload", "0.9*D(16,24)+0.1*D(500,8)",
            "--stall-timeout", "0.6", "--ttft-timeout", "1.0", "--cancel-rate", "0.05",
            "--cancel-after-tokens", "3",
        )  # fmt: skip
        truth = sim.truth()
    requests, _, manifest = result.events()
    assert manifest["status"] == "finished", result.output
    requests = requests[
        ~requests["request_id"].isin(unseen_by_server(requests, truth)["request_id"])
    ]
    kinds = requests["error_kind"].value_counts().to_dict()
    for kind in ("http_5xx", "stream_truncated", "malformed_event", "stall_timeout", "ttft_timeout",
                 "http_4xx_input", "queue_rejected", "cancelled"):  # fmt: skip
        assert kinds.get(kind, 0) > 0, (kind, kinds)
    rows = requests.set_index("request_id")
    for rid, t in truth.items():
        row = rows.loc[rid]
        if row["error_kind"] == "aborted":  # in flight at the end: the answer was never read
            continue
        if t["outcome"] == "rejected":
            expected = {400: "http_4xx_input", 429: "queue_rejected", 500: "http_5xx"}[t["status"]]
            assert row["error_kind"] == expected and row["http_status"] == t["status"], (rid, t)
            continue
        faults = [f for f in t["faults"] if f in KIND_OF_FAULT]
        if row["status"] == "ok":
            # stalls and slow headers shorter than the client's limits pass unnoticed
            assert not set(faults) - {"stall", "slow_header"} or row["error_kind"] is None, (rid, t)
            continue
        if row["error_kind"] == "cancelled":
            assert row["status"] == "cancelled"
            continue
        assert row["error_kind"] in {KIND_OF_FAULT[f] for f in faults}, (rid, row["error_kind"], t)
        assert row["error_detail"]
    # Locust's own stats count every request once, failures with their kind.
    assert "http_5xx" in result.output or "Aggregated" in result.output


def answer_once_then_vanish() -> str:
    """A target that answers the start-up preflight, then refuses every connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_connect_errors_and_total_timeouts(tmp_path: Path) -> None:
    # the target goes away after the preflight: every request is a connect error, as data
    dead = run_locust(answer_once_then_vanish(), tmp_path / "dead", "--steps", "1", "--step-duration", "1.5",
                      "--step-warmup", "0", "--cold-requests", "0", "--model", "m",
                      "--ignore-eos", "off", "--continuous-usage", "off")  # fmt: skip
    requests, _, manifest = dead.events()
    assert len(requests) > 0 and set(requests["error_kind"]) == {"connect"}, dead.output
    # the failed probes are listed too, with why they failed (the start-up preflight, answered)
    outcomes = {p["purpose"]: p["outcome"] for p in manifest["probes"]}
    assert set(outcomes) == {"preflight", "first_request", "target_models", "target_version",
                             "calibration"}  # fmt: skip
    assert outcomes.pop("preflight") == "http 404"
    assert outcomes.pop("first_request").startswith("connect: ")  # a streamed probe's kind
    assert all(o.startswith("connect error: ") for o in outcomes.values()), outcomes
    with start_sim(tmp_path / "sim") as sim:
        slow = run_locust(sim.url, tmp_path / "slow", "--steps", "1", "--step-duration", "1.5",
                          "--step-warmup", "0", "--cold-requests", "0", "--workload", "D(8,8000)",
                          "--request-timeout", "0.3")  # fmt: skip
    requests, _, _ = slow.events()
    assert "total_timeout" in set(requests["error_kind"]), slow.output


def test_distributed_run_tags_every_request_with_its_step(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim") as sim:
        result = run_locust(sim.url, tmp_path / "runs", "--steps", "1,2,4", *STEPS,
                            "--cold-requests", "1", "--workload", "D(16,16)", workers=2)  # fmt: skip
        truth = sim.truth()
    assert result.returncode == 0, result.output
    requests, _, manifest = result.events()
    unseen_by_server(requests, truth)
    assert requests["worker_id"].nunique() == 2
    assert len(manifest["workers"]) == 2 and manifest["status"] == "finished"
    # A request carries the step that was current on the master when it was sent: its send
    # time lies between that step's start and the next step's start (clocks of one machine).
    starts = [s["started_at_ns"] for s in manifest["steps"]] + [np.iinfo(np.int64).max]
    for step, group in requests[~requests["cold"]].groupby("step"):
        lo, hi = starts[step], starts[step + 1]
        assert group["sent_at_ns"].between(lo, hi + 50_000_000).all(), step  # 50 ms message latency
        assert (group["concurrency"] == manifest["steps"][step]["concurrency"]).all()
    assert int(requests["cold"].sum()) == 1


def test_bad_options_fail_before_any_request(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim") as sim:
        result = run_locust(sim.url, tmp_path / "runs", "--workload", "X(1,2)")
        truth = sim.truth()
    assert result.returncode == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if "llmload: error" in line]
    assert len(errors) == 1 and "X(1,2)" in errors[0] and "D(in,out)" in errors[0]
    assert truth == {}
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_options_come_from_environment_variables(tmp_path: Path) -> None:
    with start_sim(tmp_path / "sim") as sim:
        result = run_locust(sim.url, tmp_path / "runs", "--step-duration", "1", "--step-warmup", "0",
                            env={"LOCUST_STEPS": "2", "LOCUST_COLD_REQUESTS": "0",
                                 "LOCUST_WORKLOAD": "D(10,5)", "LOCUST_RUN_ID": "from-env"})  # fmt: skip
    assert result.returncode == 0, result.output
    requests, _, manifest = result.events()
    assert manifest["run_id"] == "from-env" and set(requests["concurrency"]) == {2}
    assert json.dumps(manifest).count("from-env") >= 1
