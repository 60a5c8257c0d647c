"""The request body's bytes (client._body_bytes): orjson's compact UTF-8 JSON, the standard
encoder's for whatever orjson refuses; the same JSON either way."""

from __future__ import annotations

import json
from typing import Any

import pytest

from locustfiles.request import client
from locustfiles.request.client import _body_bytes

STANDARD = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
EVERY_CHARACTER = "".join(chr(i) for i in range(0, 0x800)) + "\u2028\u2029😀\ufeff"


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": EVERY_CHARACTER}],
         "max_tokens": 100, "stream_options": {"include_usage": True}, "ignore_eos": True},
        {"prompt": "a \"quoted\" \\ back\nslash", "n": None, "t": False, "i": -(2**63)},
        {"nested": {"list": [1, [2, {"x": []}], {}], "empty": ""}},
    ],
)  # fmt: skip
def test_bodies_are_the_standard_encoders_bytes(body: dict[str, Any]) -> None:
    assert _body_bytes(body) == STANDARD(body).encode()


def test_floats_read_back_the_same() -> None:
    body = {"temperature": 0.7, "top_p": 1e-07, "big": 1e300, "neg": -0.0}
    assert json.loads(_body_bytes(body)) == body


@pytest.mark.parametrize(
    "body",
    [{"seed": 2**70}, {1: "an integer key"}, {"x": (1, 2)}, {"s": {"a"}}],
)
def test_what_orjson_refuses_goes_the_standard_way(body: dict[Any, Any]) -> None:
    if isinstance(body.get("s"), set):  # neither can: the standard encoder's error
        with pytest.raises(TypeError):
            _body_bytes(body)
        return
    assert _body_bytes(body) == STANDARD(body).encode()


def test_without_orjson_the_standard_encoder_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "_orjson_dumps", None)
    body = {"seed": 2**70, "text": "é"}
    assert _body_bytes(body) == STANDARD(body).encode()
