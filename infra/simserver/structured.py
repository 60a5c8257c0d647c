"""Structured answers: JSON that fits what the request asked for, or, at `--invalid-rate`,
JSON that does not.

A request with a structured-output format (`response_format` json_schema or json_object on
chat and completions, `text.format` on the Responses API) is answered with an instance of
its schema. A tool call's arguments are an instance of the tool's `parameters` (Messages:
`input_schema`). The JSON is streamed as tokens: words, numbers and punctuation, each
space-led piece one token (`pieces`).

At `--invalid-rate` an answer is broken on purpose: its last token is dropped, so the JSON
does not parse. The truth log says which answers were (`output_valid`, `invalid`). An answer
cut by `max_tokens` is broken too, as a real engine's would be. The truth log says so.

`instance` knows the usual keywords: type (one or a list), properties and required (every
property is written), items, prefixItems, minItems, enum, const, anyOf/oneOf/allOf (the first
branch), minimum/maximum, minLength/maxLength, additionalProperties. It does not resolve
`$ref` (an object stands in). A schema that uses more than this can get an answer it does not
validate. The simulator serves load tests; it is not a JSON Schema generator.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Final

WORDS: Final = ("alpha", "bravo", "delta", "echo", "lima", "oscar", "sierra", "tango")
_PIECE: Final = re.compile(r"\s*(?:[A-Za-z_]+|-?\d+(?:\.\d+)?|\\.|.)", re.S)
_DEPTH: Final = 8
INVALID_ON_PURPOSE: Final = "broken on purpose (--invalid-rate): its last token dropped"
CUT_BY_MAX_TOKENS: Final = "cut by max_tokens"


@dataclass(frozen=True)
class Structured:
    """One request's JSON answer (a structured output, or a tool call's arguments)."""

    pieces: list[str]  # its tokens
    valid: bool  # the JSON parses and fits the schema
    how: str | None  # why it does not (INVALID_ON_PURPOSE, CUT_BY_MAX_TOKENS); None: valid


def instance(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A JSON value that `schema` validates (for the keywords the module docstring lists)."""
    if not isinstance(schema, dict) or depth > _DEPTH:
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("allOf", "anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            merged = {k: v for k, v in schema.items() if k != key}
            first = branches[0] if isinstance(branches[0], dict) else {}
            return instance({**merged, **first}, rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict):
            return {}
        return {name: instance(sub, rng, depth + 1) for name, sub in props.items()}
    if kind == "array":
        prefix = schema.get("prefixItems")
        out = [instance(sub, rng, depth + 1) for sub in prefix] if isinstance(prefix, list) else []
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", max(low, 2)))
        count = max(low, min(high, 2)) if items is not None else max(low, len(out))
        while len(out) < count:
            out.append(instance(items or {}, rng, depth + 1))
        return out
    if kind in ("integer", "number"):
        lo = _bound(schema, "minimum", "exclusiveMinimum", 1, 0)
        hi = _bound(schema, "maximum", "exclusiveMaximum", -1, lo + 100)
        value = rng.randint(lo, max(lo, hi))
        return value if kind == "integer" else float(value)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    low, high = int(schema.get("minLength", 1)), int(schema.get("maxLength", 24))
    text = ""
    while len(text) < low:
        text = (text + " " + rng.choice(WORDS)).strip()
    while len(text) < high and rng.random() < 0.5:
        longer = text + " " + rng.choice(WORDS)
        if len(longer) > high:
            break
        text = longer
    return text[:high]


def _bound(schema: dict[str, Any], key: str, exclusive: str, step: int, default: int) -> int:
    """An integer bound of a number schema: `key`, else `exclusive` moved by `step`."""
    for name, shift in ((key, 0), (exclusive, step)):
        value = schema.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value) + shift
    return default


def pieces(text: str) -> list[str]:
    """`text` as tokens: each word, number or punctuation mark with the spaces before it."""
    out = _PIECE.findall(text)
    assert "".join(out) == text
    return out


def answer_pieces(schema: Any, rng: random.Random) -> list[str]:
    """An instance of `schema` as compact JSON tokens."""
    return pieces(json.dumps(instance(schema, rng), separators=(", ", ": ")))


def fit(parts: list[str], target: int) -> tuple[list[str], bool]:
    """`parts` made `target` tokens long: spaces after the JSON (still valid), or cut short
    (not valid: the second value is False)."""
    if len(parts) > target:
        return parts[:target], False
    return parts + [" "] * (target - len(parts)), True
