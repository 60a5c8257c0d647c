"""The chat user against a real engine: `transformers serve` with a tiny random-weight Llama.

Needs the engine environment (`make test-engine`: .venv-engine with CPU torch and
transformers); skipped elsewhere. One server (continuous batching, CPU) serves the module;
each test is one headless llmload run against it, checked against what the server itself
reported: `usage` in the stream, the echoed `X-Request-Id`, and uvicorn's access log.

What transformers serve does that matters here (5.x): it rejects unknown body fields with
422 (so `ignore_eos` is refused), ignores `stream_options` (usage comes only in the last
event, never continuously, and no `[DONE]`), counts the EOS token in `completion_tokens`
although the EOS has no text, and accepts a `generation_config` JSON string per request,
whose `eos_token_id: -1` turns stopping on EOS off.

Three servers: the model as built (it samples its EOS now and then), the same model built
with `--no-eos` (EOS suppressed in its generation config: every output reaches max_tokens
and every token has text), and a `--no-eos --small-vocab` model whose tokenizer is a
byte-level BPE of 400 tokens trained on made-up words (few of llmload's words are one token:
exact prompts are made of the tokenizer's own tokens). Set LLMLOAD_ENGINE_CACHE=DIR to keep
the models in DIR between sessions instead of building them in a temporary directory (~6 s
each).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis import build_report
from analysis.derive.metrics import compute_request_metrics
from infra.engines.tiny_llama import MARKER
from infra.engines.transformers_serve import TransformersServe
from tests.support.chat import ROOT, LocustResult, run_locust


def _engine_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        not _engine_installed(), reason="needs torch + transformers (make test-engine)"
    ),
]

STEPS = ("--steps", "1,2", "--step-duration", "3", "--step-warmup", "1", "--cold-requests", "2")
# POSTs a local run makes before its load: the preflight's first_request probe (one request
# of the run's shape), the worker's continuous-usage probe (accepted: stream_options is
# ignored) and two prompt-calibration probes; and the worker's ignore_eos probe (422).
PROBES_OK = 4
PROBES_422 = 1
FORCE_LENGTH = json.dumps({"generation_config": json.dumps({"eos_token_id": -1})})


def _build(out: Path, *flags: str) -> Path:
    subprocess.run(
        [sys.executable, "-m", "infra.engines.tiny_llama", str(out), *flags],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("LLMLOAD_ENGINE_CACHE")
    return Path(given) if given else tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def tiny_model(models_dir: Path) -> Path:
    return _build(models_dir / "tiny-llama")


@pytest.fixture(scope="module")
def tiny_model_no_eos(models_dir: Path) -> Path:
    return _build(models_dir / "tiny-llama-no-eos", "--no-eos")


@pytest.fixture(scope="module")
def tiny_model_small_vocab(models_dir: Path) -> Path:
    return _build(models_dir / "tiny-llama-bpe400", "--no-eos", "--small-vocab")


@pytest.fixture(scope="module")
def server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TransformersServe]:
    """The model as built: samples EOS now and then (a natural stop before max_tokens)."""
    with TransformersServe(tiny_model, tmp_path_factory.mktemp("serve")) as srv:
        yield srv


@pytest.fixture(scope="module")
def server_no_eos(
    tiny_model_no_eos: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TransformersServe]:
    """The same model with EOS suppressed in its generation config: lengths forced at launch."""
    with TransformersServe(tiny_model_no_eos, tmp_path_factory.mktemp("serve-no-eos")) as srv:
        yield srv


@pytest.fixture(scope="module")
def server_small_vocab(
    tiny_model_small_vocab: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TransformersServe]:
    """The no-EOS model with a 400-token byte-level BPE trained on made-up words."""
    with TransformersServe(tiny_model_small_vocab, tmp_path_factory.mktemp("serve-bpe400")) as srv:
        yield srv


@dataclass
class Run:
    result: LocustResult
    requests: pd.DataFrame
    chunks: pd.DataFrame
    manifest: dict[str, Any]
    server_posts: Counter[int]  # HTTP status -> POSTs the server logged during the run

    @property
    def ok(self) -> pd.DataFrame:
        return self.requests[self.requests["status"] == "ok"].set_index("request_id")

    def chunk_sums(self) -> pd.Series:
        sums = self.chunks.groupby("request_id")["tokens"].sum()
        return sums.reindex(self.ok.index, fill_value=0)


def run(server: TransformersServe, events_dir: Path, *args: str) -> Run:
    mark = server.log_mark()
    result = run_locust(server.url, events_dir, "--model", server.model_id, *args, timeout=180)
    assert result.returncode == 0, (
        result.output[-4000:] + "\n--- server ---\n" + server.log_tail(1500)
    )
    requests, chunks, manifest = result.events()
    return Run(result, requests, chunks, manifest, server.access_counts(since=mark))


def check_run(r: Run, last_concurrency: int) -> None:
    """What every run must show: no lost or duplicated request, ok results, sane timings."""
    req = r.requests
    assert r.manifest["status"] == "finished"
    assert len(req) > 10, r.result.output[-2000:]
    # Unique ids, each request with a final status; the server echoed every id it received.
    assert req["request_id"].is_unique
    assert req["status"].notna().all() and req["end_ns"].notna().all()
    answered = req[req["http_status"].notna()]
    assert (answered["server_request_id"] == answered["request_id"]).all()
    # Every request ok, except streams still in flight when the run stopped (one per user).
    statuses = req["status"].value_counts().to_dict()
    failed = req[~req["status"].isin(["ok", "aborted"])]
    assert failed.empty, failed[["status", "error_kind", "error_detail"]].to_string()
    assert statuses.get("aborted", 0) <= last_concurrency, statuses
    assert (req.loc[req["status"] == "aborted", "step"] == req["step"].max()).all()
    # No lost request: the server's access log has one POST per request row, plus the probes.
    assert set(r.server_posts) <= {200, 422}, r.server_posts
    assert r.server_posts[422] == PROBES_422  # ignore_eos refused once, never sent again
    sent_200 = int((req["http_status"] == 200).sum())
    not_answered = int(req["http_status"].isna().sum())  # aborted before the headers came
    assert sent_200 <= r.server_posts[200] - PROBES_OK <= sent_200 + not_answered, (
        r.server_posts,
        sent_200,
    )
    assert "ignore_eos off (probe: HTTP 422)" in r.result.output
    # Timings: ordered, not negative, and TPOT equal to the mean per-token ITL where every token
    # came in an event (not so where an EOS without text counts in usage).
    ok = r.ok
    m = compute_request_metrics(ok.reset_index(), r.chunks).per_request.set_index(ok.index)
    # A request whose first sampled token was EOS has no token with text, hence no TTFT.
    textless = m["ttft_s"].isna()
    assert (ok.loc[textless, "completion_tokens"] == 1).all() and textless.mean() < 0.05
    m = m[~textless]
    assert (m["ttfe_s"] > 0).all() and (m["ttft_s"] >= m["ttfe_s"]).all()
    assert (m["e2e_s"] >= m["ttft_s"]).all() and (m["e2e_s"] < 60).all()
    ok = ok[~textless]
    multi = ok["output_tokens"] >= 2
    seen = r.chunk_sums().reindex(ok.index)  # tokens that came in events
    # Zero is possible: under load the server writes several queued events in one go, and
    # they arrive in one read (one timestamp).
    assert (m.loc[multi, "tpot_s"] >= 0).all() and (m.loc[seen >= 2, "itl_mean_s"] >= 0).all()
    assert m.loc[multi, "tpot_s"].median() > 0
    every_token_seen = (seen >= 2) & (seen == ok["output_tokens"])
    assert every_token_seen.mean() > 0.8
    tpot, itl = m.loc[every_token_seen, "tpot_s"], m.loc[every_token_seen, "itl_mean_s"]
    assert np.allclose(tpot, itl, rtol=1e-6)


def test_exact_prompts_and_token_counts_with_the_models_tokenizer(
    server: TransformersServe, tiny_model: Path, tmp_path: Path
) -> None:
    r = run(server, tmp_path / "runs", *STEPS, "--workload", "0.5*D(32,16)+0.5*U(8,96)/(4,40)",
            "--tokenizer", str(tiny_model))  # fmt: skip
    check_run(r, last_concurrency=2)
    assert "words pieces, exact by construction" in r.result.output  # llmload's own words
    ok = r.ok
    assert ok["prompt_tokens_requested"].nunique() > 5
    assert (ok["prompt_tokens"] == ok["prompt_tokens_requested"]).all()
    # Without ignore_eos a request stops at its cap or earlier (EOS, about 1 token in 1,000).
    assert (ok["completion_tokens"] <= ok["max_tokens"]).all()
    capped = ok["completion_tokens"] == ok["max_tokens"]
    print(f"\n{int(capped.sum())} of {len(ok)} ok requests hit max_tokens")
    # The tokenizer counts every event's text; each event carries one token.
    # (a request whose only token was an EOS has no event with text: its count is usage's)
    with_text = ok["first_token_ns"].notna()
    assert (ok.loc[with_text, "output_tokens_source"] == "tokenizer").all()
    assert (ok.loc[~with_text, "output_tokens_source"] == "usage").all()
    assert set(r.chunks["tokens"]) == {1}
    # The EOS has no text: llmload places it at the finish event as a 0-character chunk row,
    # so every request's chunk tokens add up to usage, and requests that stopped early
    # (before their cap) end with that row.
    assert (r.chunk_sums() == ok["completion_tokens"]).all()
    textless = r.chunks[r.chunks["chars"] == 0]
    assert (textless["tokens"] == 1).all()
    assert set(ok.index[~capped]) <= set(textless["request_id"])
    assert (ok["output_tokens"] == ok["completion_tokens"]).all()


def test_lengths_forced_per_request_with_a_generation_config(
    server: TransformersServe, tiny_model: Path, tmp_path: Path
) -> None:
    r = run(server, tmp_path / "runs", *STEPS, "--workload", "U(8,64)/(2,48)",
            "--tokenizer", str(tiny_model), "--extra-body", FORCE_LENGTH)  # fmt: skip
    check_run(r, last_concurrency=2)
    ok = r.ok
    assert ok["max_tokens"].nunique() > 5
    assert (ok["completion_tokens"] == ok["max_tokens"]).all()
    assert (ok["prompt_tokens"] == ok["prompt_tokens_requested"]).all()
    # With EOS off the model may still sample its EOS token: it counts in usage but has no
    # text, so no event carries it (about 1 token in 1,000; the no-EOS model avoids this).
    invisible = ok["completion_tokens"] - r.chunk_sums()
    print(f"\n{int((invisible > 0).sum())} of {len(ok)} ok requests carried a token without text")
    assert (invisible >= 0).all() and (invisible == 0).mean() > 0.8


def test_no_eos_model_forces_lengths_and_every_token_is_an_event(
    server_no_eos: TransformersServe, tiny_model_no_eos: Path, tmp_path: Path
) -> None:
    r = run(server_no_eos, tmp_path / "runs", *STEPS, "--workload", "0.5*D(32,16)+0.5*U(8,96)/(2,48)",
            "--tokenizer", str(tiny_model_no_eos))  # fmt: skip
    check_run(r, last_concurrency=2)
    ok = r.ok
    assert ok["max_tokens"].nunique() > 5
    assert (ok["completion_tokens"] == ok["max_tokens"]).all()
    assert (ok["prompt_tokens"] == ok["prompt_tokens_requested"]).all()
    # (a request whose only token was an EOS has no event with text: its count is usage's)
    with_text = ok["first_token_ns"].notna()
    assert (ok.loc[with_text, "output_tokens_source"] == "tokenizer").all()
    assert (ok.loc[~with_text, "output_tokens_source"] == "usage").all()
    assert (r.chunk_sums() == ok["completion_tokens"]).all()


def test_calibrated_prompts_and_event_counts_without_a_tokenizer(
    server_no_eos: TransformersServe, tmp_path: Path
) -> None:
    r = run(server_no_eos, tmp_path / "runs", "--steps", "4", "--step-duration", "4", "--step-warmup", "1",
            "--cold-requests", "0", "--workload", "U(16,400)/(8,32)")  # fmt: skip
    check_run(r, last_concurrency=4)
    ok = r.ok
    # The calibration probes learn the chat template's overhead from the server's usage; each
    # of llmload's words is one token of this tokenizer, so lengths come out exact.
    assert (ok["prompt_tokens"] == ok["prompt_tokens_requested"]).all()
    # (a request whose only token was an EOS has no event with text: its count is usage's)
    with_text = ok["first_token_ns"].notna()
    assert (ok.loc[with_text, "output_tokens_source"] == "events").all()
    assert (ok.loc[~with_text, "output_tokens_source"] == "usage").all()
    assert (ok["completion_tokens"] == ok["max_tokens"]).all()
    assert (r.chunk_sums() == ok["completion_tokens"]).all()


def test_exact_prompts_with_a_small_byte_level_bpe_tokenizer(
    server_small_vocab: TransformersServe, tiny_model_small_vocab: Path, tmp_path: Path
) -> None:
    tokenizer = json.loads((tiny_model_small_vocab / MARKER).read_text())["tokenizer"]
    # under 1,000 tokens, and too few whole words to make prompts of (refused before issue 11)
    assert tokenizer["vocab_size"] < 1000 and tokenizer["single_token_prompt_words"] < 50
    r = run(server_small_vocab, tmp_path / "runs", *STEPS,
            "--workload", "0.5*D(32,16)+0.5*U(12,600)/(2,32)",
            "--tokenizer", str(tiny_model_small_vocab))  # fmt: skip
    check_run(r, last_concurrency=2)
    assert "vocabulary pieces, exact by construction" in r.result.output
    ok = r.ok
    assert ok["prompt_tokens_requested"].nunique() > 5
    # the server's own count, chat template included, is the requested length
    assert (ok["prompt_tokens"] == ok["prompt_tokens_requested"]).all()
    assert (ok["completion_tokens"] == ok["max_tokens"]).all()
    assert (r.chunk_sums() == ok["completion_tokens"]).all()


def test_without_a_tokenizer_the_report_states_the_prompt_offset(
    server_small_vocab: TransformersServe, tmp_path: Path
) -> None:
    """Each of llmload's words is several tokens of this tokenizer, and not always as many:
    calibration fits the mean, single prompts come out off, and the report says by how much."""
    r = run(server_small_vocab, tmp_path / "runs", "--steps", "2", "--step-duration", "4",
            "--step-warmup", "1", "--cold-requests", "0", "--workload", "U(32,400)/(2,16)")  # fmt: skip
    check_run(r, last_concurrency=2)
    ok = r.ok
    off = (ok["prompt_tokens"] - ok["prompt_tokens_requested"]).abs()
    print(
        f"\nwithout a tokenizer: prompts {off.mean():.1f} tokens off on average (max {off.max()})"
    )
    report = build_report(str(r.result.run_dir()), tmp_path / "report", progress=False, html=False)
    step = report.table.rows[-1]
    assert step["prompt_tokens_offset_mean"] > 1
    assert any(
        w.startswith(f"step {step['step']}: prompts came out") and "give --tokenizer" in w
        for w in report.warnings
    ), report.warnings


def test_multi_turn_sessions_complete_against_a_real_engine(
    server: TransformersServe, tiny_model: Path, tmp_path: Path
) -> None:
    """3-turn conversations: every turn resends the history, which the engine counts."""
    r = run(server, tmp_path / "runs", *STEPS, "--workload", "D(32,8)", "--turns", "3",
            "--followup-workload", "D(8,8)", "--think-time", "0.05",
            "--tokenizer", str(tiny_model))  # fmt: skip
    req = r.requests
    failed = req[~req["status"].isin(["ok", "aborted"])]
    assert failed.empty, failed[["status", "error_kind", "error_detail"]].to_string()
    assert req["session_id"].notna().all() and set(req["turn"]) == {0, 1, 2}
    ok = r.ok
    complete = ok.groupby("session_id").filter(lambda g: len(g) == 3)
    assert complete["session_id"].nunique() >= 3
    for _, group in complete.groupby("session_id"):
        ordered = group.sort_values("turn")
        prompts = ordered["prompt_tokens"].tolist()
        # each later turn's prompt holds the earlier turns: longer by at least the last reply
        # and the new 8-token message (the chat template adds its own tokens around them)
        for k in (1, 2):
            assert prompts[k] >= prompts[k - 1] + ordered["output_tokens"].iloc[k - 1] + 8
        assert ordered["history_tokens"].iloc[1:].notna().all()
    assert (ok.loc[ok["turn"] == 0, "prompt_tokens"] == 32).all()  # exact with the tokenizer
