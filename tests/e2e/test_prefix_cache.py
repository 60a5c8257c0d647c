"""Shared prefixes and the cache phase against the simulated engine and its truth log.

`--prefix-groups 4 --prefix-tokens 256` with the simulator's block size 16: a request finds
its group's prefix cached as exactly 256 tokens (16 full blocks; what follows the prefix is
its own). Before the run the test warms the engine with every prefix itself, so that a flush
has something to empty:

- `flush+prime`: every steady request of the steps (sent inside a step's window) that reached
  the engine well before its step ended (ADMISSION_MARGIN_NS) finds 256 tokens cached (the
  predicted hit rate), the first of each group included. (The previous step's users keep running across a step
  change: a request of step 0 sent after its window, or sent at its very end and reaching the
  engine after the flush before step 1, may find its group flushed and not yet primed.)
- `flush` alone: the first request of each group (by send time) finds 0 cached though the
  cache was warm before the run; later ones find 256 once one of their group has ended.
"""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis import build_report
from locustfiles.traffic.prompts import PromptBuilder
from tests.support.chat import run_locust, start_sim

GROUPS, TOKENS, PROMPT = 4, 256, 400
# A request is admitted (and finds its cache) at the engine step after its arrival, not at
# the arrival: one that arrives in the last moments of its step may be admitted after the
# next step's flush. Requests arriving this close to their step's end may find 0 or 256.
ADMISSION_MARGIN_NS = 200_000_000
SIM = ("--block-size", "16", "--decode-base-ms", "5", "--decode-per-seq-us", "0",
       "--decode-per-kv-token-ns", "0", "--prefill-per-token-us", "20")  # fmt: skip
RUN = ("--steps", "2,2", "--step-duration", "3", "--step-warmup", "0.2", "--cold-requests",
       "0", "--workload", f"D({PROMPT},4)", "--store-prompts", "--seed", "0",
       "--prefix-groups", str(GROUPS), "--prefix-tokens", str(TOKENS))  # fmt: skip


def _warm(url: str, prefixes: list[str]) -> None:
    """Each prefix once, straight to the engine (not through llmload)."""
    for text in prefixes:
        body = json.dumps({"model": None, "max_tokens": 1,
                           "messages": [{"role": "user", "content": text + " tail"}]})  # fmt: skip
        req = urllib.request.Request(url + "/v1/chat/completions", body.encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as reply:
            assert reply.status == 200


def _run(tmp: Path, phase: str) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any], str, Any]:
    builder = PromptBuilder(0, None, TOKENS, GROUPS)
    prefixes = [builder.prime_text(g, 0, random.Random(0)) for g in range(GROUPS)]
    with start_sim(tmp, *SIM) as server:
        _warm(server.url, prefixes)
        result = run_locust(server.url, tmp / "runs", *RUN, "--cache-phase", phase, timeout=120)
        truth = server.raw_truth()
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
    assert result.returncode == 0, result.output[-3000:]
    requests, _, manifest = result.events()
    ok = requests[requests["status"] == "ok"].copy()
    ok["group"] = [
        next(g for g, p in enumerate(prefixes) if t.startswith(p)) for t in ok["prompt_text"]
    ]
    ok["server_cached"] = [truth[r]["cached_tokens"] for r in ok["request_id"]]
    ok["arrival_ns"] = [truth[r]["arrival_unix_ns"] for r in ok["request_id"]]
    ended = {s["step"]: s["ended_at_ns"] - ADMISSION_MARGIN_NS for s in manifest["steps"]}
    # reached the engine well before its step ended, so was admitted (its cache looked up)
    # before the next step's flush (one clock)
    ok["before_end"] = ok["arrival_ns"] < ok["step"].map(ended).fillna(float("inf"))
    report = build_report(str(result.run_dir()), tmp / "report", progress=False)
    steady = report.per_request.set_index("request_id")["steady"]
    ok["steady"] = steady.reindex(ok["request_id"]).fillna(False).to_numpy(bool)
    return ok, manifest, truth, metrics, result


@pytest.fixture(scope="module")
def primed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _run(tmp_path_factory.mktemp("primed"), "flush+prime")


@pytest.fixture(scope="module")
def flushed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _run(tmp_path_factory.mktemp("flushed"), "flush")


def test_flush_and_prime_give_the_predicted_hit_rate(primed: Any, tmp_path: Path) -> None:
    ok, manifest, truth, metrics, result = primed
    steady = ok[ok["steady"]]
    assert len(steady) >= 20 and set(steady["group"]) == set(range(GROUPS))
    assert set(steady["step"]) == {0, 1}
    inside = steady[steady["before_end"]]
    assert len(inside) >= 0.8 * len(steady)  # (3 s steps: 0.2 s at their end is left out)
    assert (inside["server_cached"] == TOKENS).all(), inside["server_cached"].value_counts()
    assert (inside["cached_tokens"] == TOKENS).all()  # what the client recorded from usage
    assert (steady["cached_tokens"] == steady["server_cached"]).all()
    assert set(ok["server_cached"]) <= {0, TOKENS}
    for step in manifest["steps"]:
        assert step["cache_phase"] == {"phase": "flush+prime", "flush": "ok",
                                       "flush_route": "/reset_prefix_cache",
                                       "flush_detail": "POST /reset_prefix_cache: ok",
                                       "primed": GROUPS, "prime_failed": 0}  # fmt: skip
    purposes = [p["purpose"] for p in manifest["probes"]]
    assert purposes.count("cache_flush") == 2 and purposes.count("cache_prime") == 2 * GROUPS
    primes = [p["request_id"] for p in manifest["probes"] if p["purpose"] == "cache_prime"]
    assert all(rid in truth and rid not in set(ok["request_id"]) for rid in primes)
    assert "llmload_sim_prefix_cache_resets_total 2.0" in metrics
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False)
    steps = [r for r in report.table.rows if r["group"] == "step"]
    for row in steps:
        assert row["cache_phase"] == "flush+prime" and row["cache_flush"] == "ok"
        assert row["cache_primed"] == GROUPS
        assert row["cached_implied_pct"] == pytest.approx(100 * TOKENS / PROMPT)
        mine = steady[steady["step"] == row["step"]]
        found = 100 * mine["server_cached"].sum() / (PROMPT * len(mine))
        assert row["cached_tokens_pct"] == pytest.approx(found)
    assert not [w for w in report.warnings if "prefix" in w or "flush" in w]
    md = report.files["report.md"].read_text()
    assert "## Prefix cache" in md and "| 1 | flush+prime | ok | 4 | 64.0% |" in md


def test_flush_alone_gives_zero_until_a_request_of_the_group_ended(
    flushed: Any, tmp_path: Path
) -> None:
    ok, manifest, _, _, result = flushed
    first = ok[ok["step"] == 0].sort_values("sent_at_ns").groupby("group").head(1)
    assert len(first) == GROUPS
    assert (first["server_cached"] == 0).all()  # warm before the run: the flush emptied it
    assert set(ok["server_cached"]) <= {0, TOKENS}
    assert manifest["steps"][0]["cache_phase"]["flush"] == "ok"
    assert manifest["steps"][0]["cache_phase"]["primed"] == 0
    assert not [p for p in manifest["probes"] if p["purpose"] == "cache_prime"]
    report = build_report(str(result.run_dir()), tmp_path / "report", progress=False)
    step0 = next(r for r in report.table.rows if r["step"] == 0)
    assert step0["cache_primed"] is None and step0["cache_phase"] == "flush"


def test_a_refused_flush_is_recorded_and_warned(tmp_path: Path) -> None:
    """A target without the flush routes (here: any path the simulator does not serve is
    404, so point the run at a base URL under a prefix) ... uses the engine as it is."""
    with start_sim(tmp_path, *SIM) as server:
        from locustfiles.master.cachephase import CachePhase
        from locustfiles.options.options import from_parsed
        from locustfiles.options.table import TABLE

        ns = type("NS", (), {o.name: o.default for o in TABLE})()
        ns.cache_phase = "flush"
        options = from_parsed(ns)
        noted: list[Any] = []
        record = CachePhase(options, server.url + "/nothing", lambda: None, noted.extend).run(0)
    assert record is not None and record["flush"] == "refused"
    assert record["flush_detail"] == ("POST /reset_prefix_cache: http 404; "
                                      "POST /flush_cache: http 404")  # fmt: skip
    assert [p.purpose for p in noted] == ["cache_flush", "cache_flush"]
