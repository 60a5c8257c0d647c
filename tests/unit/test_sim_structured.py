"""The simulator's structured answers (infra/simserver/structured.py): instances its schemas
validate, streamed as tokens that join back into the JSON, fitted to a length."""

from __future__ import annotations

import json
import random

import pytest
from jsonschema.validators import validator_for

from infra.simserver.structured import answer_pieces, fit, instance, pieces
from locustfiles.traffic.sessions import TOOLS

SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                      "days": {"type": "integer", "minimum": 1, "maximum": 9}},
     "required": ["city", "days"], "additionalProperties": False},
    {"type": "array", "items": {"type": "number", "exclusiveMinimum": 5}, "minItems": 3},
    {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "ok": {"type": "boolean"},
                                      "none": {"type": "null"}, "tag": {"const": "x"},
                                      "either": {"anyOf": [{"type": "string", "minLength": 3},
                                                           {"type": "integer"}]},
                                      "pair": {"type": "array", "prefixItems": [
                                          {"type": "string"}, {"type": "integer"}]}}},
    {"type": ["string", "null"], "minLength": 5},
    TOOLS[0]["function"]["parameters"],
]  # fmt: skip


@pytest.mark.parametrize("schema", SCHEMAS)
def test_every_instance_is_valid_and_streams_back_to_itself(schema: dict) -> None:
    check = validator_for(schema)(schema)
    rng = random.Random(0)
    for _ in range(50):
        value = instance(schema, rng)
        assert not list(check.iter_errors(value)), value
        parts = answer_pieces(schema, rng)
        assert json.loads("".join(parts)) is not None or "".join(parts) == "null"
        assert all(parts)


def test_pieces_are_words_numbers_and_marks_with_their_spaces() -> None:
    assert pieces('{"a": [1, -2.5], "b": "x y"}') == [
        "{", '"', "a", '"', ":", " [", "1", ",", " -2.5", "]", ",", ' "', "b", '"', ":",
        ' "', "x", " y", '"', "}"]  # fmt: skip


def test_fitting_pads_with_spaces_or_cuts() -> None:
    parts = pieces('{"a": 1}')
    longer, fits = fit(parts, len(parts) + 3)
    assert fits and json.loads("".join(longer)) == {"a": 1} and longer[-3:] == [" "] * 3
    shorter, fits = fit(parts, len(parts) - 1)
    assert not fits and len(shorter) == len(parts) - 1
    with pytest.raises(ValueError):
        json.loads("".join(shorter))
