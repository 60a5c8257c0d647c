"""Workload specs: what prompt length and output cap each request gets.

Grammar (weights optional, normalised; components joined with `+`):

    D(in,out)                          fixed lengths
    N(mean_in,sd_in)/(mean_out,sd_out) normal, rounded
    U(min_in,max_in)/(min_out,max_out) uniform integers, bounds included
    0.7*D(128,64)+0.3*N(2048,512)/(256,64)
    dataset:PATH.jsonl                 one JSON object per line: "prompt" (text) or
                                       "messages" (chat list); optional "max_tokens",
                                       optional "prompt_tokens" (its known length)
    conversations:PATH.jsonl           recorded multi-turn chats (ShareGPT "conversations"
                                       or "messages"), replayed turn by turn as sessions

Sampling is seeded and reproducible: the same seed and worker index give the same sequence.
Lengths that cannot be right are refused when the spec is parsed: a D length, an N mean or a
U minimum below 1, a negative N sd, a U minimum above its maximum, a weight that is not > 0.
An N draw that falls below 1 is clamped to 1, with one warning per component.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.errors import UsageError

log = logging.getLogger(__name__)

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_PAIR = rf"\({_NUM},{_NUM}\)"
_COMPONENT = re.compile(
    rf"^\s*(?:(?P<weight>-?\d+(?:\.\d+)?)\s*\*)?\s*(?:"
    rf"D{_PAIR}"
    rf"|(?P<dist>[NU]){_PAIR}\s*/\s*{_PAIR}"
    rf")\s*$"
)


@dataclass(frozen=True)
class RequestSpec:
    """One request's shape: lengths to aim for, or a dataset prompt to send as it is."""

    scenario: str
    prompt_tokens: int | None
    max_tokens: int | None
    prompt_text: str | None = None
    messages: list[dict[str, Any]] | None = None
    conversation: Conversation | None = None  # a recorded chat, replayed turn by turn


@dataclass(frozen=True)
class Conversation:
    """A recorded multi-turn chat: an optional system prompt, then the user turns, each
    with the length of the reply it got (the output cap of its replay; None: unknown)."""

    system: str | None
    turns: tuple[tuple[str, int | None], ...]


@dataclass
class _Lengths:
    """A D/N/U component."""

    name: str
    kind: str  # D, N or U
    a_in: float
    b_in: float
    a_out: float
    b_out: float
    warned: bool = field(default=False, compare=False)

    def _draw(self, rng: random.Random, a: float, b: float) -> float:
        if self.kind == "D":
            return a
        if self.kind == "N":
            return rng.gauss(a, b)
        return rng.randint(int(a), int(b))

    def sample(self, rng: random.Random) -> RequestSpec:
        if self.kind == "D":
            p_in, p_out = self.a_in, self.b_in  # D(in,out): the pair is (in, out)
        else:
            p_in = self._draw(rng, self.a_in, self.b_in)
            p_out = self._draw(rng, self.a_out, self.b_out)
        n_in, n_out = round(p_in), round(p_out)
        if (n_in < 1 or n_out < 1) and not self.warned:
            log.warning("workload %s asked for a length below 1; clamping to 1", self.name)
            self.warned = True
        return RequestSpec(self.name, max(1, n_in), max(1, n_out))


@dataclass
class _Dataset:
    name: str
    rows: list[dict[str, Any]]

    def sample(self, rng: random.Random) -> RequestSpec:
        row = self.rows[rng.randrange(len(self.rows))]
        return RequestSpec(
            self.name,
            row.get("prompt_tokens"),
            row.get("max_tokens"),
            prompt_text=row.get("prompt"),
            messages=row.get("messages"),
        )


@dataclass
class _Conversations:
    name: str
    rows: list[Conversation]

    def sample(self, rng: random.Random) -> RequestSpec:
        chat = self.rows[rng.randrange(len(self.rows))]
        first, first_max = chat.turns[0]
        return RequestSpec(self.name, None, first_max, prompt_text=first, conversation=chat)


_SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
             "chatgpt": "assistant", "bard": "assistant", "system": "system"}  # fmt: skip


def _json_line(path: Path, lineno: int, line: str) -> Any:
    """One JSON-lines line, or UsageError naming the file and line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path}:{lineno}: not valid JSON ({exc.msg}); give one JSON object per line"
        ) from None


def _conversation_row(path: Path, lineno: int, line: str) -> Conversation:
    """One recorded chat: ShareGPT's {"conversations": [{"from", "value"}]} or
    {"messages": [{"role", "content"}]}; other speakers (tools, functions) are skipped."""
    row = _json_line(path, lineno, line)
    items = (row.get("conversations") or row.get("messages")) if isinstance(row, dict) else None
    if not isinstance(items, list):
        raise UsageError(
            f'{path}:{lineno}: each line needs a "conversations" list of {{"from", "value"}} '
            'or a "messages" list of {"role", "content"}'
        )
    system: str | None = None
    turns: list[list[Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        speaker = _SPEAKERS.get(str(item.get("from") or item.get("role") or "").lower())
        text = item.get("value") if "value" in item else item.get("content")
        if speaker is None or not isinstance(text, str):
            continue
        if speaker == "system":
            system = text if not turns else system
        elif speaker == "user" and text.strip():
            turns.append([text, None])
        elif speaker == "assistant" and turns and turns[-1][1] is None:
            turns[-1][1] = max(1, len(text.split()))
    if not turns:
        raise UsageError(
            f"{path}:{lineno}: the conversation has no user (human) turn to replay; give it "
            'at least one non-empty turn {"from": "human", "value": ...} '
            '(or {"role": "user", "content": ...})'
        )
    return Conversation(system, tuple((t, n) for t, n in turns))


def _load_conversations(spec: str) -> _Conversations:
    text = spec.split(":", 1)[1].strip()
    path = Path(text)
    if not text or not path.is_file():
        raise UsageError(
            f"workload conversations {text or '(no path)'} is not a file; give conversations:PATH.jsonl"
        )
    try:
        with path.open(encoding="utf-8") as fh:
            rows = [_conversation_row(path, n, ln) for n, ln in enumerate(fh, 1) if ln.strip()]
    except UnicodeDecodeError:
        raise UsageError(f"workload conversations {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"cannot read workload conversations {path}: {exc.strerror}") from None
    if not rows:
        raise UsageError(f"workload conversations {path} has no conversations")
    return _Conversations(f"conversations:{path.name}", rows)


class Workload:
    """A weighted mix of components; `sample()` draws one RequestSpec."""

    def __init__(self, spec: str, components: list[Any], weights: list[float]) -> None:
        self.spec = spec
        self.components = components
        total = sum(weights)
        self.weights = [w / total for w in weights]

    def sampler(self, seed: int, stream: int = 0) -> WorkloadSampler:
        return WorkloadSampler(self, random.Random(f"llmload:{seed}:{stream}"))

    @property
    def scenarios(self) -> list[str]:
        return [c.name for c in self.components]


class WorkloadSampler:
    """A seeded stream of RequestSpecs from one Workload."""

    def __init__(self, workload: Workload, rng: random.Random) -> None:
        self.workload = workload
        self.rng = rng

    def sample(self) -> RequestSpec:
        comps = self.workload.components
        comp = comps[0] if len(comps) == 1 else self.rng.choices(comps, self.workload.weights)[0]
        spec: RequestSpec = comp.sample(self.rng)
        return spec


def _dataset_row(path: Path, lineno: int, line: str) -> dict[str, Any]:
    """One line of a dataset, checked: a prompt that can be sent, lengths >= 1."""
    row = _json_line(path, lineno, line)
    prompt, messages = (row.get("prompt"), row.get("messages")) if isinstance(row, dict) else (0, 0)
    if not (isinstance(prompt, str) and prompt) and not (isinstance(messages, list) and messages):
        raise UsageError(
            f'{path}:{lineno}: each line needs a non-empty "prompt" string or "messages" list'
        )
    for key in ("max_tokens", "prompt_tokens"):
        value = row.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise UsageError(
                f"{path}:{lineno}: {key} must be an integer >= 1, not {value!r}; "
                f'give e.g. "{key}": 128, or leave the key out'
            )
    return dict(row)


def _load_dataset(spec: str) -> _Dataset:
    text = spec.split(":", 1)[1].strip()
    if not text:
        raise UsageError("workload dataset: no path given; use dataset:PATH.jsonl")
    path = Path(text)
    if not path.exists():
        raise UsageError(f"workload dataset {path} does not exist; give dataset:PATH.jsonl")
    if not path.is_file():
        raise UsageError(f"workload dataset {path} is not a file; give dataset:PATH.jsonl")
    try:
        with path.open(encoding="utf-8") as fh:
            rows = [_dataset_row(path, n, line) for n, line in enumerate(fh, 1) if line.strip()]
    except UnicodeDecodeError:
        raise UsageError(
            f"workload dataset {path} is not UTF-8 text; give a JSON-lines file"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read workload dataset {path}: {exc.strerror}") from None
    if not rows:
        raise UsageError(
            f'workload dataset {path} has no prompts; give one JSON object per line with "prompt"'
        )
    return _Dataset(f"dataset:{path.name}", rows)


_EXAMPLES = {"D": "D(128,64)", "N": "N(2048,512)/(256,64)", "U": "U(64,256)/(16,128)"}


def _check_lengths(comp: _Lengths) -> None:
    """Refuse lengths no request can have (a token count below 1), naming the component."""

    def need(ok: bool, problem: str) -> None:
        if not ok:
            raise UsageError(f"workload {comp.name}: {problem}; e.g. {_EXAMPLES[comp.kind]}")

    if comp.kind == "D":
        for what, value in (("prompt", comp.a_in), ("output", comp.b_in)):
            need(value >= 1, f"the {what} length must be >= 1 token, not {value:g}")
        return
    for what, a, b in (("prompt", comp.a_in, comp.b_in), ("output", comp.a_out, comp.b_out)):
        if comp.kind == "N":
            need(a >= 1, f"the {what} mean of N(mean,sd) must be >= 1 token, not {a:g}")
            need(b >= 0, f"the {what} sd of N(mean,sd) needs sd >= 0, not {b:g}")
        else:
            need(a >= 1, f"the {what} min of U(min,max) must be >= 1 token, not {a:g}")
            need(a <= b, f"the {what} bounds of U(min,max) need min <= max, not {a:g} > {b:g}")


def parse_workload(spec: str) -> Workload:
    """Parse a workload spec; raise UsageError naming the bad part and the expected form."""
    text = spec.strip()
    if text.startswith("dataset:"):
        return Workload(text, [_load_dataset(text)], [1.0])
    if text.startswith("conversations:"):
        return Workload(text, [_load_conversations(text)], [1.0])
    components: list[Any] = []
    weights: list[float] = []
    for part in text.split("+"):
        m = _COMPONENT.match(part)
        if not m:
            raise UsageError(
                f"workload component {part.strip()!r} is not understood; use D(in,out), "
                "N(mean_in,sd_in)/(mean_out,sd_out), U(min_in,max_in)/(min_out,max_out), "
                "weighted like 0.7*D(128,64)+0.3*U(10,20)/(5,9), or dataset:PATH.jsonl"
            )
        groups = m.groups()  # weight, D's two numbers, N/U letter, N/U's four numbers
        nums = [float(g) for i, g in enumerate(groups) if i not in (0, 3) and g is not None]
        kind = m.group("dist") or "D"
        name = re.sub(r"^\s*-?\d+(?:\.\d+)?\s*\*\s*", "", part).replace(" ", "")
        if kind == "D":
            comp = _Lengths(name, "D", nums[0], nums[1], 0, 0)
        else:
            comp = _Lengths(name, kind, nums[0], nums[1], nums[2], nums[3])
        _check_lengths(comp)
        weight = float(m.group("weight")) if m.group("weight") else 1.0
        if weight <= 0:
            raise UsageError(
                f"workload {name}: weight must be positive, not {weight:g}; "
                "e.g. 0.7*D(128,64)+0.3*D(2048,256)"
            )
        components.append(comp)
        weights.append(weight)
    return Workload(text, components, weights)
