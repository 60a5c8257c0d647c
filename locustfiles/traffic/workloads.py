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
    trace:PATH                         a recorded trace (Mooncake JSONL, Azure or BurstGPT
                                       CSV) replayed by its timestamps (trace.py)

Each length is a distribution of the one grammar for a varying number (distribution.py):
D's sides are fixed values, the N and U sides its N(mean,sd) and U(a,b), in whole tokens.
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
from enum import Enum
from pathlib import Path
from typing import Any

from analysis.kernel.distribution import (
    NUMBER,
    BadDistribution,
    Distribution,
    parse_distribution,
)
from analysis.kernel.errors import UsageError
from analysis.kernel.schema import REQUESTS_SCHEMA, int_max
from analysis.kernel.storage import expand_home
from locustfiles.traffic.trace import TraceReplay, trace_path

log = logging.getLogger(__name__)

# A component: an optional weight, then the prompt and output lengths, each a distribution of
# distribution.py's grammar: D(in,out) gives two fixed ones, X(..)/(..) two of form X.
_COMPONENT = re.compile(
    rf"^\s*(?:(?P<weight>{NUMBER})\s*\*)?\s*(?P<name>"
    r"D\((?P<d_in>[^,()]*),(?P<d_out>[^,()]*)\)"
    r"|(?P<form>[NU])(?P<x_in>\([^()]*\))\s*/\s*(?P<x_out>\([^()]*\))"
    r")\s*$"
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
    prefix_blocks: tuple[int, ...] = ()  # a trace's hash_ids: shared blocks begin the prompt
    block_tokens: int = 0  # tokens per prefix block


@dataclass(frozen=True)
class Conversation:
    """A recorded multi-turn chat: an optional system prompt, then the user turns, each
    with the length of the reply it got (the output cap of its replay; None: unknown)."""

    system: str | None
    turns: tuple[tuple[str, int | None], ...]


@dataclass
class _Lengths:
    """A D/N/U component: the prompt and output lengths' distributions (whole tokens)."""

    name: str
    prompt: Distribution
    output: Distribution
    warned: bool = field(default=False, compare=False)

    def sample(self, rng: random.Random) -> RequestSpec:
        n_in, n_out = self.prompt.sample(rng, False), self.output.sample(rng, False)
        if n_in < 1 or n_out < 1:
            if not self.warned:
                log.warning("workload %s asked for a length below 1; clamping to 1", self.name)
                self.warned = True
            n_in, n_out = max(1, n_in), max(1, n_out)
        return RequestSpec(self.name, int(n_in), int(n_out))


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


@dataclass
class _Trace:
    """A recorded trace (trace.py): arrival i sends the window's row i. `replay` is the
    window, loaded once the --trace-* options are known (options/tracerun.py)."""

    name: str
    path: Path
    replay: TraceReplay | None = None

    def spec(self, index: int) -> RequestSpec:
        assert self.replay is not None, "the trace is not loaded"
        row = self.replay.rows[index]
        return RequestSpec(self.name, row.input_length, row.output_length,
                           prefix_blocks=row.hash_ids, block_tokens=self.replay.block_tokens)  # fmt: skip

    def sample(self, rng: random.Random) -> RequestSpec:
        """A random row (the cold phase's requests, which no arrival schedules)."""
        assert self.replay is not None, "the trace is not loaded"
        return self.spec(rng.randrange(len(self.replay.rows)))


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
    path = Path(expand_home(text, "workload conversations"))
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


class WorkloadKind(Enum):
    """Where a workload's requests come from: `parse_workload` sets it, the only place that
    reads the spec's prefix; everyone else asks `Workload.kind`."""

    LENGTHS = "lengths"  # a mix of length distributions: D(in,out), N(..)/(..), U(..)/(..)
    DATASET = "dataset"  # dataset:PATH.jsonl
    CONVERSATIONS = "conversations"  # conversations:PATH.jsonl (multi-turn)
    TRACE = "trace"  # trace:PATH (a recorded trace, replayed by arrival index)


class Workload:
    """A weighted mix of components; `sample()` draws one RequestSpec."""

    def __init__(
        self,
        spec: str,
        components: list[Any],
        weights: list[float],
        kind: WorkloadKind = WorkloadKind.LENGTHS,
    ) -> None:
        self.spec = spec
        self.kind = kind
        self.components = components
        total = sum(weights)
        self.weights = [w / total for w in weights]

    def sampler(self, seed: int, stream: int = 0) -> WorkloadSampler:
        return WorkloadSampler(self, random.Random(f"llmload:{seed}:{stream}"))

    @property
    def scenarios(self) -> list[str]:
        return [c.name for c in self.components]

    @property
    def trace(self) -> _Trace | None:
        """A `trace:PATH` workload's requests (sent by arrival index), else None."""
        if self.kind is not WorkloadKind.TRACE:
            return None
        trace: _Trace = self.components[0]
        return trace


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


_DATASET_INTS = {"max_tokens": "max_tokens", "prompt_tokens": "prompt_tokens_requested"}
"""A dataset line's integer keys and the requests column each ends up in (analysis.kernel.schema):
a value the column cannot hold is refused at start, not row by row by the sink."""


def _dataset_row(path: Path, lineno: int, line: str) -> dict[str, Any]:
    """One line of a dataset, checked: a prompt that can be sent, lengths >= 1."""
    row = _json_line(path, lineno, line)
    prompt, messages = (row.get("prompt"), row.get("messages")) if isinstance(row, dict) else (0, 0)
    if not (isinstance(prompt, str) and prompt) and not (isinstance(messages, list) and messages):
        raise UsageError(
            f'{path}:{lineno}: each line needs a non-empty "prompt" string or "messages" list'
        )
    for key, column in _DATASET_INTS.items():
        value = row.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise UsageError(
                f"{path}:{lineno}: {key} must be an integer >= 1, not {value!r}; "
                f'give e.g. "{key}": 128, or leave the key out'
            )
        if value is not None and value > (most := int_max(REQUESTS_SCHEMA, column)):
            raise UsageError(
                f"{path}:{lineno}: {key} {value} is above {most}, the most a request row "
                f'records ({column}); give e.g. "{key}": 128, or leave the key out'
            )
    return dict(row)


def _load_dataset(spec: str) -> _Dataset:
    text = spec.split(":", 1)[1].strip()
    if not text:
        raise UsageError("workload dataset: no path given; use dataset:PATH.jsonl")
    path = Path(expand_home(text, "workload dataset"))
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


def _lengths(part: str, name: str, form: str, texts: tuple[str, str]) -> _Lengths:
    """Parse a component's two lengths (tokens >= 1; fractions round), naming the bad one."""
    spellings = ("K",) if form == "D" else (form,)
    dists = []
    for what, text in zip(("prompt", "output"), texts, strict=True):
        try:
            dists.append(
                parse_distribution(text, spellings=spellings, integer=True, whole=False, minimum=1)
            )
        except BadDistribution as bad:
            if bad.rule == "syntax":
                raise _not_understood(part) from None
            raise UsageError(
                f"workload {name}: {_problem(what, bad)}; e.g. {_EXAMPLES[form]}"
            ) from None
    return _Lengths(name, dists[0], dists[1])


def _problem(what: str, bad: BadDistribution) -> str:
    a, b = (*bad.params, 0.0)[:2]
    return {
        ("fixed", "min"): f"the {what} length must be >= 1 token, not {a:g}",
        ("normal", "min"): f"the {what} mean of N(mean,sd) must be >= 1 token, not {a:g}",
        ("normal", "sd"): f"the {what} sd of N(mean,sd) needs sd >= 0, not {b:g}",
        ("uniform", "min"): f"the {what} min of U(min,max) must be >= 1 token, not {a:g}",
        ("uniform", "order"): f"the {what} bounds of U(min,max) need min <= max, not {a:g} > {b:g}",
    }[(bad.kind or "", bad.rule)]


def _not_understood(part: str) -> UsageError:
    return UsageError(
        f"workload component {part.strip()!r} is not understood; use D(in,out), "
        "N(mean_in,sd_in)/(mean_out,sd_out), U(min_in,max_in)/(min_out,max_out), "
        "weighted like 0.7*D(128,64)+0.3*U(10,20)/(5,9), or dataset:PATH.jsonl"
    )


def workload_kind(spec: str) -> WorkloadKind:
    """A workload spec's kind, from its prefix (the one place that reads it), without loading
    any file."""
    prefix, sep, _ = spec.strip().partition(":")
    if sep and prefix in ("dataset", "conversations", "trace"):
        return WorkloadKind(prefix)
    return WorkloadKind.LENGTHS


def parse_workload(spec: str) -> Workload:
    """Parse a workload spec; raise UsageError naming the bad part and the expected form."""
    text = spec.strip()
    kind = workload_kind(text)
    if kind is WorkloadKind.DATASET:
        return Workload(text, [_load_dataset(text)], [1.0], kind)
    if kind is WorkloadKind.CONVERSATIONS:
        return Workload(text, [_load_conversations(text)], [1.0], kind)
    if kind is WorkloadKind.TRACE:
        path = trace_path(text)
        return Workload(text, [_Trace(f"trace:{path.name}", path)], [1.0], kind)
    components: list[Any] = []
    weights: list[float] = []
    for part in text.split("+"):
        m = _COMPONENT.match(part)
        if not m:
            raise _not_understood(part)
        name = m.group("name").replace(" ", "")
        form = m.group("form")
        if form is None:
            comp = _lengths(part, name, "D", (m.group("d_in"), m.group("d_out")))
        else:
            comp = _lengths(part, name, form, (form + m.group("x_in"), form + m.group("x_out")))
        weight = float(m.group("weight")) if m.group("weight") else 1.0
        if weight <= 0:
            raise UsageError(
                f"workload {name}: weight must be positive, not {weight:g}; "
                "e.g. 0.7*D(128,64)+0.3*D(2048,256)"
            )
        components.append(comp)
        weights.append(weight)
    return Workload(text, components, weights)
