"""Trace replay (`--workload trace:PATH`) across two real workers, judged by the server's truth.

The bundled Mooncake example (examples/traces/, written by examples/make_traces.py) is
replayed at 10x by two workers against the simulator: every row is sent once, by its own
arrival index; the server's inter-arrival gaps follow the trace's; and each request's
`cached_tokens` is what the trace's `hash_ids` imply under the simulator's prefix cache
(docs/simserver.md#the-prefix-cache). The Azure and BurstGPT examples replay with exact
prompt lengths under a tokenizer (a word-level one, which counts as the simulator does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from infra.simserver.prefix_cache import block_keys
from locustfiles.traffic.trace import TraceReplay, TraceSettings, load_trace
from tests.support.chat import run_locust, start_sim, unseen_by_server
from tests.support.ks import ks_two_sample

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
pytestmark = pytest.mark.slow  # two minutes of replays: `make test-slow` (CI runs it)

SPEEDUP = 10.0
SIM_BLOCK = 16  # the simulator's --block-size; the trace's 512-token blocks are 32 of its
FINISH_MARGIN_NS = 5_000_000  # insertion into the cache and the last event: the same step


def _replay(tmp: Path, trace: Path, *extra: str) -> tuple[pd.DataFrame, dict[str, Any], Any]:
    with start_sim(tmp / "sim", "--profile", "tiny") as sim:
        result = run_locust(
            sim.url, tmp / "runs", "--workload", f"trace:{trace}", "--trace-speedup",
            str(SPEEDUP), "--cold-requests", "0", "--seed", "0", *extra,
            workers=2, timeout=150,
        )  # fmt: skip
        truth = sim.truth()
    assert result.returncode == 0, result.output[-3000:]
    requests, _chunks, manifest = result.events()
    return requests, truth, manifest


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    path = TRACES / "mooncake.jsonl"
    replay = load_trace(path, TraceSettings(speedup=SPEEDUP))
    requests, truth, manifest = _replay(tmp_path_factory.mktemp("mooncake"), path)
    return replay, requests, truth, manifest


def test_every_trace_row_is_sent_once_by_its_own_worker(mooncake: tuple[Any, ...]) -> None:
    replay, requests, truth, manifest = mooncake
    (step,) = manifest["steps"]
    assert step["arrival"] == "trace" and step["rate"] == pytest.approx(replay.rate)
    assert manifest["config"]["trace_speedup"] == f"{SPEEDUP:g}"  # as written, a spec's text
    unseen = unseen_by_server(requests, truth)
    assert unseen.empty and (requests["status"] == "ok").all()
    assert sorted(requests["arrival_index"]) == list(range(len(replay.rows)))
    for position, worker in enumerate(step["share_workers"]):
        mine = requests[requests["worker_id"] == worker]
        assert len(mine) > 0 and (mine["arrival_index"] % 2 == position).all()
    rows = [replay.rows[i] for i in requests["arrival_index"]]
    assert list(requests["prompt_tokens_requested"]) == [r.input_length for r in rows]
    assert list(requests["max_tokens"]) == [r.output_length for r in rows]
    assert list(requests["prompt_tokens"]) == [r.input_length for r in rows]  # the sim's count


def test_server_arrival_gaps_follow_the_trace(mooncake: tuple[Any, ...]) -> None:
    replay, requests, truth, _ = mooncake
    arrivals = sorted(truth[r]["arrival_unix_ns"] / 1e9 for r in requests["request_id"])
    served = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    offsets = replay.offsets_s
    recorded = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    d, p = ks_two_sample(served, recorded)
    assert p > 0.01, (d, p)
    span = arrivals[-1] - arrivals[0]
    assert span == pytest.approx(offsets[-1] - offsets[0], rel=0.05)


def _tokens(index: int, row: Any, block_tokens: int) -> list[tuple[Any, ...]]:
    """A request's prompt as the trace implies it: token j is (hash id, j) inside its blocks
    (the same in every prompt with that id), its own after them."""
    covered = block_tokens * len(row.hash_ids)
    return [("b", row.hash_ids[j // block_tokens], j % block_tokens) if j < covered
            else ("u", index, j) for j in range(row.input_length)]  # fmt: skip


def _cached(prompt_keys: list[int], prompt_tokens: int, cache: set[int]) -> int:
    limit = min(len(prompt_keys), (prompt_tokens - 1) // SIM_BLOCK)
    hit = 0
    while hit < limit and prompt_keys[hit] in cache:
        hit += 1
    return hit * SIM_BLOCK


def test_cached_tokens_are_what_the_hash_ids_imply(mooncake: tuple[Any, ...]) -> None:
    """The cache holds the blocks of every request that finished before a request was
    admitted (the truth log's `scheduled_offset_ns`; the cache is far larger than the trace:
    nothing is evicted). Each request's cached tokens must equal what the trace's hash_ids
    imply from those requests exactly; a request admitted in the same engine step as another
    finished (within FINISH_MARGIN_NS) may see that one's blocks or not, and is checked
    between the two."""
    replay, requests, truth, _ = mooncake
    ends: list[tuple[int, int, list[int]]] = []  # (finished, index, keys)
    by_index = {}
    for rid, index in zip(requests["request_id"], requests["arrival_index"], strict=True):
        t = truth[rid]
        row = replay.rows[index]
        tokens = _tokens(index, row, replay.block_tokens)
        generated = [("g", index, k) for k in range(t["completion_tokens"])]
        ends.append((t["arrival_unix_ns"] + t["events"][-1][0], index,
                     block_keys(tokens + generated, SIM_BLOCK)))  # fmt: skip
        admitted = t["arrival_unix_ns"] + t["scheduled_offset_ns"]
        by_index[index] = (t, row, block_keys(tokens, SIM_BLOCK), admitted)
    exact = shared = 0
    for index, (t, row, prompt_keys, admitted) in by_index.items():
        before = {k for f, i, ks in ends if f < admitted - FINISH_MARGIN_NS and i != index
                  for k in ks}  # fmt: skip
        upto = {k for f, i, ks in ends if f < admitted + FINISH_MARGIN_NS and i != index
                for k in ks}  # fmt: skip
        low = _cached(prompt_keys, row.input_length, before)
        high = _cached(prompt_keys, row.input_length, upto)
        assert low <= t["cached_tokens"] <= high, (index, row, t["cached_tokens"], low, high)
        exact += low == high
        shared += t["cached_tokens"] > 0
    assert exact >= 0.98 * len(by_index), (exact, len(by_index))
    assert shared >= 0.3 * len(by_index)  # the trace's prefixes really are shared


def _word_level_tokenizer(tmp: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from locustfiles.traffic.pieces import WORDS

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp / "tokenizer.json"))
    return tmp / "tokenizer.json"


@pytest.mark.parametrize("name", ["azure.csv", "burstgpt.csv"])
def test_csv_traces_replay_with_exact_lengths_under_a_tokenizer(name: str, tmp_path: Path) -> None:
    path = TRACES / name
    replay: TraceReplay = load_trace(path, TraceSettings(speedup=SPEEDUP))
    requests, truth, manifest = _replay(
        tmp_path, path, "--tokenizer", str(_word_level_tokenizer(tmp_path))
    )
    assert manifest["config"]["trace_format"] == "auto" and replay.format in name
    assert sorted(requests["arrival_index"]) == list(range(len(replay.rows)))
    assert (requests["status"] == "ok").all() and set(requests["request_id"]) == set(truth)
    rows = [replay.rows[i] for i in requests["arrival_index"]]
    assert list(requests["prompt_tokens"]) == [r.input_length for r in rows]
    assert list(requests["prompt_tokens_requested"]) == [r.input_length for r in rows]
    assert list(requests["max_tokens"]) == [r.output_length for r in rows]
