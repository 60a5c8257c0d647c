"""Pure logic of the simulator: distributions, token rule, profiles, request validation."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import pytest

from analysis.kernel.errors import UsageError
from infra.simserver.dist import IntDist
from infra.simserver.options import add_arguments
from infra.simserver.profiles import PROFILES, get_profile
from infra.simserver.schema import GenerationParams, Kind, RequestRejected, parse_generation
from infra.simserver.sse import ChunkEncoder
from infra.simserver.tokens import TokenText, count_tokens


def test_int_dist_parse_and_sample() -> None:
    assert IntDist.parse("3") == IntDist(3, 3)
    dist = IntDist.parse("1-4")
    rng = random.Random(1)
    assert {dist.sample(rng) for _ in range(200)} == {1, 2, 3, 4}
    for bad in ("0", "4-1", "x", "1-2-3", ""):
        with pytest.raises(UsageError):
            IntDist.parse(bad)


def test_token_rule_counts_generated_text_exactly() -> None:
    assert count_tokens("  hello   big\nworld\t") == 3
    text = TokenText(seed=5)
    for start, n in ((0, 1), (4090, 17), (123, 10_000)):
        out = text.text(start, n).decode()
        assert count_tokens(out) == n
        assert out.startswith(" ")
    assert TokenText(5).text(9, 30) == text.text(9, 30)
    assert TokenText(6).text(9, 30) != text.text(9, 30)


def test_step_time_formula() -> None:
    p = get_profile("8b-1gpu")
    assert p.step_time(0, 0, 0) == 0
    assert p.step_time(1, 100, 0) == pytest.approx(
        p.decode_base + p.decode_per_seq + 100 * p.decode_per_kv_token
    )
    assert p.step_time(0, 0, 1000) == pytest.approx(p.decode_base + 1000 * p.prefill_per_token)
    assert p.step_time(32, 0, 0) > p.step_time(1, 0, 0)


def test_profiles_are_valid_and_overrides_checked() -> None:
    for profile in PROFILES.values():
        profile.check()
    tiny = get_profile("tiny")
    assert tiny.with_overrides(max_num_seqs=4, decode_base=None).max_num_seqs == 4
    with pytest.raises(UsageError):
        tiny.with_overrides(max_num_seqs=0)
    with pytest.raises(UsageError):
        tiny.with_overrides(kv_cache_tokens=10)
    with pytest.raises(UsageError):
        get_profile("nope")


def _parse(body: dict[str, Any], kind: Kind = "chat", max_len: int = 100) -> GenerationParams:
    return parse_generation(kind, json.dumps(body).encode(), "m", max_len)


def test_parse_generation() -> None:
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]},
                         {"role": "system", "content": "c"}]}  # fmt: skip
    params = _parse({**chat, "max_tokens": 5, "stream": True,
                     "stream_options": {"include_usage": True}})  # fmt: skip
    assert (params.prompt_tokens, params.max_tokens, params.include_usage) == (3, 5, True)
    assert _parse(chat).max_tokens == 97  # defaults to what fits
    assert _parse({**chat, "max_tokens": 9, "max_completion_tokens": 4}).max_tokens == 4
    assert _parse({"prompt": [[1, 2, 3]]}, kind="completion").prompt_tokens == 3
    for body, status in (
        ({**chat, "max_tokens": 98}, 400),
        ({**chat, "n": 2}, 400),
        ({**chat, "min_tokens": 9, "max_tokens": 3}, 400),
        ({**chat, "stream_options": {"include_usage": True}}, 400),
        ({**chat, "model": "other"}, 404),
        ({**chat, "max_tokens": True}, 400),
        ({"prompt": ["a", "b"]}, 400),
    ):
        with pytest.raises(RequestRejected) as info:
            _parse(body, kind="completion" if "prompt" in body else "chat")
        assert info.value.status == status


def test_chunk_encoder_emits_valid_json() -> None:
    enc = ChunkEncoder("chat", 'chatcmpl-"q"', 1, "m", 4, continuous_usage=True)
    events = [enc.role(), enc.content(b" ka lo", 2), enc.finish("stop", 2), enc.usage(2)]
    decoded = []
    for event in events:
        assert event is not None and event.startswith(b"data: ") and event.endswith(b"\n\n")
        decoded.append(json.loads(event[6:]))
    assert decoded[0]["id"] == 'chatcmpl-"q"'
    assert decoded[1]["choices"][0]["delta"]["content"] == " ka lo"
    assert decoded[1]["usage"] == {"prompt_tokens": 4, "total_tokens": 6, "completion_tokens": 2}
    assert decoded[2]["choices"][0]["finish_reason"] == "stop"
    assert decoded[3]["choices"] == []
    completion = ChunkEncoder("completion", "c", 1, "m", 1, continuous_usage=False)
    assert completion.role() is None
    assert json.loads(completion.content(b" x", 1)[6:])["choices"][0]["text"] == " x"


def test_every_option_is_documented() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "simserver.md").read_text()
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    missing = [f for f in flags if f != "--help" and f"`{f}" not in doc]
    assert not missing
    for name in PROFILES:
        assert f"`{name}`" in doc
