"""Valid outputs: each answer checked against what its request asked for.

Under load, a server can answer `status ok` with output that is no use: JSON that does not
parse, an object that breaks the schema asked for, or a tool call whose arguments do not
fit the tool. A load test that counts those as successes overstates goodput. So a request
is judged after it ends:

- `--response-format json_schema:FILE` sends the schema as a structured-output request
  (`response_format` on chat and completions, `text.format` on the Responses API). The
  answer's text must be JSON that the schema validates.
- `--response-format json_object` asks for any JSON object, and the answer must be one.
- A tool call (the tools a session offers, `--tool-rate`) must name an offered tool, and its
  arguments must be JSON that the tool's `parameters` schema validates.

The verdict goes on the row as `output_valid` and, when false, `output_invalid_reason`.
The status stays `ok`. A request with nothing to check (no format asked for, no tool call,
or a failed request) has neither.

The schema is checked when the options are read: a file that is not JSON, or not a valid
JSON Schema, is refused with exit 2. Each worker compiles the validators once.
Validation runs on the worker, after the request's last byte: it is no part of any timing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from analysis.kernel.errors import UsageError
from locustfiles.request.record import RequestRecord

KINDS: Final = ("json_object", "json_schema")
REASON_CHARS: Final = 200
"""The longest `output_invalid_reason` (as `error_detail`)."""
FORMAT_ENDPOINTS: Final = ("chat", "completions", "responses")
"""The endpoints a structured-output request is sent to (the Messages API has none)."""


def _validator(schema: dict[str, Any]) -> Any:
    """A compiled validator of the schema's own draft (Draft 2020-12 when it names none)."""
    from jsonschema.validators import validator_for

    cls = validator_for(schema)
    return cls(schema)


def check_schema(schema: Any, where: str) -> None:
    """Refuse what is no JSON Schema (UsageError naming `where` and the fix)."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    if not isinstance(schema, (dict, bool)):
        raise UsageError(f"{where} is not a JSON Schema: it must be a JSON object; fix the file")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(p) for p in exc.path) or "(the top)"
        raise UsageError(
            f"{where} is not a valid JSON Schema: {exc.message} (at {path}); fix the schema"
        ) from None


@dataclass(frozen=True)
class ResponseFormat:
    """--response-format: the structured output asked of every request."""

    kind: str  # json_object | json_schema
    schema: dict[str, Any] | None = None  # json_schema: the schema
    name: str = "llmload"  # json_schema: its name in the request (the file's stem)
    path: str = ""  # json_schema: the file, as given

    @property
    def spec(self) -> str:
        return f"json_schema:{self.path}" if self.kind == "json_schema" else self.kind

    def body(self, endpoint: str) -> dict[str, Any]:
        """The request body's fields that ask for it, in `endpoint`'s shape."""
        if self.kind == "json_object":
            fmt: dict[str, Any] = {"type": "json_object"}
        else:
            fmt = {"type": "json_schema",
                   "json_schema": {"name": self.name, "schema": self.schema, "strict": True}}  # fmt: skip
        if endpoint == "responses":  # the Responses API: text.format, the schema's fields flat
            flat = {"type": fmt["type"], **fmt.get("json_schema", {})}
            return {"text": {"format": flat}}
        return {"response_format": fmt}


def parse_response_format(text: str) -> ResponseFormat | None:
    """--response-format: `json_object`, `json_schema:FILE`, or empty (none)."""
    text = text.strip()
    if not text:
        return None
    if text == "json_object":
        return ResponseFormat("json_object")
    kind, _, path = text.partition(":")
    if kind != "json_schema" or not path:
        raise UsageError(
            f"--response-format {text!r} is not a format: give json_object or "
            "json_schema:FILE (a JSON Schema file), e.g. --response-format json_schema:answer.json"
        )
    where = f"--response-format json_schema:{path}"
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"{where}: cannot read the file ({exc}); give a JSON Schema file"
        ) from None
    try:
        schema = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"{where}: the file is not JSON ({exc}); fix the file") from None
    check_schema(schema, where)
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in Path(path).stem)[:64]
    return ResponseFormat("json_schema", schema, name or "llmload", path)


@dataclass
class OutputCheck:
    """One worker's judge of its answers: the format asked for and the tools offered."""

    response_format: ResponseFormat | None
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI chat's shape
    _format: Any = None
    _tools: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fmt = self.response_format
        if fmt is not None and fmt.kind == "json_schema":
            self._format = _validator(fmt.schema or {})
        for tool in self.tools:
            function = tool.get("function") or {}
            self._tools[function["name"]] = _validator(function.get("parameters") or {})

    @property
    def collects_text(self) -> bool:
        """Whether a request's answer text must be kept until it ends."""
        return self.response_format is not None

    def judge(self, record: RequestRecord) -> None:
        """`output_valid` and `output_invalid_reason` of an ended request (ok only)."""
        if record.status != "ok":
            return
        reason: str | None
        if record.tool_call_parts:
            reason = self._calls(record.tool_call_parts)
        elif self.response_format is not None:
            reason = self._answer("".join(record.reply_parts or ()))
        else:
            return
        record.output_valid = reason is None
        if reason is not None:
            if record.max_tokens is not None and record.output_tokens == record.max_tokens:
                reason += f" (the answer took all {record.max_tokens} max_tokens: cut short?)"
            record.output_invalid_reason = reason[:REASON_CHARS]

    def _answer(self, text: str) -> str | None:
        value, reason = _json(text, "the answer")
        if reason is not None:
            return reason
        fmt = self.response_format
        assert fmt is not None
        if fmt.kind == "json_object":
            return None if isinstance(value, dict) else "the answer is JSON but not an object"
        return _schema_reason(self._format, value, "the answer")

    def _calls(self, calls: dict[int, dict[str, str]]) -> str | None:
        for index in sorted(calls):
            call = calls[index]
            name = call.get("name") or ""
            validator = self._tools.get(name)
            if validator is None:
                offered = ", ".join(sorted(self._tools)) or "none"
                return f"tool call {index} names {name!r}, which was not offered ({offered})"
            what = f"tool call {index} ({name}) arguments"
            value, reason = _json(call.get("arguments") or "", what)
            if reason is None:
                reason = _schema_reason(validator, value, what)
            if reason is not None:
                return reason
        return None


def _json(text: str, what: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except ValueError as exc:
        shown = text if len(text) <= 40 else text[:37] + "..."
        return None, f"{what} is not JSON: {exc} ({shown!r})"


def _schema_reason(validator: Any, value: Any, what: str) -> str | None:
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    at = "/".join(str(p) for p in error.absolute_path) or "(the top)"
    return f"{what}: against the schema at {at}: {error.message}"
