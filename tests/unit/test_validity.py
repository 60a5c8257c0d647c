"""Valid outputs (locustfiles/request/validity.py): --response-format read and refused, the
request's fields, and each answer judged: JSON, the schema, tool calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.kernel.errors import UsageError
from locustfiles.options.options import from_parsed
from locustfiles.request.record import RequestRecord
from locustfiles.request.validity import OutputCheck, parse_response_format
from locustfiles.traffic.sessions import TOOLS
from tests.support.options import parsed_options

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def schema_file(tmp_path: Path, schema: object = SCHEMA, name: str = "trip.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(schema) if not isinstance(schema, str) else schema)
    return path


def answered(text: str = "", *, calls: dict[int, dict[str, str]] | None = None,
             status: str = "ok", output_tokens: int = 10) -> RequestRecord:  # fmt: skip
    rec = RequestRecord("r", 0, 1, False, "D(1,1)", "chat", "m", True, 1, 64, "h")
    rec.reply_parts = [text[: len(text) // 2], text[len(text) // 2 :]]  # as streamed, in parts
    rec.tool_call_parts = calls
    rec.status = status
    rec.output_tokens = output_tokens
    return rec


def test_a_schema_file_is_read_and_sent_in_each_apis_shape(tmp_path: Path) -> None:
    fmt = parse_response_format(f"json_schema:{schema_file(tmp_path)}")
    assert fmt is not None and fmt.kind == "json_schema" and fmt.name == "trip"
    chat = fmt.body("chat")["response_format"]
    assert chat == {"type": "json_schema",
                    "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}  # fmt: skip
    assert fmt.body("responses") == {"text": {"format": {
        "type": "json_schema", "name": "trip", "schema": SCHEMA, "strict": True}}}  # fmt: skip
    assert parse_response_format("json_object").body("chat") == {  # type: ignore[union-attr]
        "response_format": {"type": "json_object"}}  # fmt: skip
    assert parse_response_format("") is None


@pytest.mark.parametrize("content, message", [
    ("{not json", "the file is not JSON"),
    ({"type": "objekt"}, "is not a valid JSON Schema: 'objekt' is not valid"),
    ({"properties": {"a": {"minimum": "one"}}}, "is not a valid JSON Schema"),
    ([1, 2], "must be a JSON object"),
])  # fmt: skip
def test_a_file_that_is_no_json_schema_is_refused_naming_the_fix(
    tmp_path: Path, content: object, message: str
) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_response_format(f"json_schema:{schema_file(tmp_path, content)}")
    assert "\n" not in str(info.value) and "fix the" in str(info.value)


def test_no_file_and_no_format_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read the file"):
        parse_response_format(f"json_schema:{tmp_path / 'missing.json'}")
    with pytest.raises(UsageError, match="give json_object or json_schema:FILE"):
        parse_response_format("yaml")


def test_the_options_refuse_what_cannot_hold_a_format(tmp_path: Path) -> None:
    spec = f"json_schema:{schema_file(tmp_path)}"
    with pytest.raises(UsageError, match="the messages API has no structured-output request"):
        from_parsed(parsed_options(response_format=spec, endpoint="messages"))
    with pytest.raises(UsageError, match="would run each answer past the end of its format"):
        from_parsed(parsed_options(response_format=spec, ignore_eos="on"))
    with pytest.raises(UsageError, match="give the format once"):
        from_parsed(parsed_options(response_format=spec, extra_body='{"response_format": {}}'))
    options = from_parsed(parsed_options(response_format=spec))
    assert options.ignore_eos == "off"  # auto: the grammar ends each answer
    assert options.config()["response_format"] == spec
    assert from_parsed(parsed_options()).config()["response_format"] == ""


def test_answers_are_judged_against_the_schema(tmp_path: Path) -> None:
    check = OutputCheck(parse_response_format(f"json_schema:{schema_file(tmp_path)}"))
    good = answered('{"city": "Lyon", "days": 3}')
    check.judge(good)
    assert (good.output_valid, good.output_invalid_reason) == (True, None)
    broken = answered('{"city": "Lyon", "days": ')
    check.judge(broken)
    assert broken.output_valid is False
    assert broken.output_invalid_reason.startswith("the answer is not JSON: Expecting value")
    wrong = answered('{"city": "Lyon", "days": 0}')
    check.judge(wrong)
    assert wrong.output_invalid_reason == (
        "the answer: against the schema at days: 0 is less than the minimum of 1"
    )
    cut = answered('{"city": "Ly', output_tokens=64)  # all of max_tokens: said
    check.judge(cut)
    assert "took all 64 max_tokens: cut short?" in cut.output_invalid_reason
    failed = answered("", status="error")
    check.judge(failed)
    assert failed.output_valid is None  # a failed request: nothing to judge


def test_json_object_asks_for_an_object_only() -> None:
    check = OutputCheck(parse_response_format("json_object"))
    for text, valid in (('{"a": [1]}', True), ("[1, 2]", False), ("", False)):
        rec = answered(text)
        check.judge(rec)
        assert rec.output_valid is valid, text


def test_tool_calls_are_judged_against_the_tools_offered() -> None:
    check = OutputCheck(None, TOOLS)
    valid = answered(calls={0: {"id": "c", "name": "lookup", "arguments": '{"query": "x"}'}})
    check.judge(valid)
    assert valid.output_valid is True
    cases = {
        '{"q": "x"}': "tool call 0 (lookup) arguments: against the schema at (the top): "
        "'query' is a required property",
        '{"query": ': "tool call 0 (lookup) arguments is not JSON",
    }
    for arguments, reason in cases.items():
        rec = answered(calls={0: {"id": "c", "name": "lookup", "arguments": arguments}})
        check.judge(rec)
        assert rec.output_valid is False and rec.output_invalid_reason.startswith(reason)
    unknown = answered(calls={0: {"id": "c", "name": "search", "arguments": "{}"}})
    check.judge(unknown)
    assert unknown.output_invalid_reason == (
        "tool call 0 names 'search', which was not offered (lookup)"
    )
    plain = answered("any text")  # no format asked for, no tool call: nothing to judge
    check.judge(plain)
    assert plain.output_valid is None
