"""A campaign file (YAML or TOML) read and validated into typed dataclasses.

    campaign = load_campaign("examples/sim-campaign.yaml")   # or parse_campaign(mapping)
    campaign.workload[0].spec, campaign.levels, campaign.mode, campaign.engine.metadata()

Every key, its type, default and meaning: docs/campaign-config.md. Any problem raises
UsageError with one line naming the file, the key and the fix, before anything is started:
first every unknown key and every missing required key of the file, all in one message,
then the first value that cannot be right (wrong type, bad workload or SLO, a zero step),
then the first pair of keys that contradict each other (`steps` and `rates`, a search
without the steps it needs or without an SLO to judge by).
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final, Literal, NoReturn

from analysis.errors import UsageError

EXTERNAL: Final = "external"
SEARCH_MODES: Final = ("off", "concurrency", "rate")
OVER_CAP: Final = ("wait", "drop")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# Options the campaign sets itself: in `extra` they would contradict the file.
OWNED_FLAGS = {
    "--host": "target.url", "-H": "target.url", "--model": "target.model",
    "--api-key-env": "target.api_key_env", "--workload": "workload", "--steps": "steps",
    "--step-duration": "step_duration", "--step-warmup": "step_warmup",
    "--cold-requests": "cold_requests", "--events-uri": "events_uri", "--run-id": "name",
    "--metadata": "engine", "--master": "workers", "--worker": "workers",
    "--expect-workers": "workers", "--master-bind-host": "master_bind_host",
    "--master-bind-port": "master_port", "--headless": "(always headless)",
    "-f": "(the llmload locustfile)", "--locustfile": "(the llmload locustfile)",
    "--rates": "rates", "--arrival": "arrival", "--max-concurrency": "max_concurrency",
    "--over-cap": "over_cap", "--search": "search", "--slo": "slo",
    "--turns": "turns", "--think-time": "think_time", "--history": "history",
    "--followup-workload": "followup_workload", "--tool-rate": "tool_rate",
    "--tool-latency": "tool_latency",
    "--search-precision": "search_precision", "--search-min-requests": "search_min_requests",
}  # fmt: skip
OPEN_LOOP_KEYS: Final = ("arrival", "max_concurrency", "over_cap")
_SESSION_EXAMPLES: Final = {"turns": "3 or U(2,5)", "think_time": "2 or exp(2)",
                            "history": "full or window:4", "followup_workload": "D(64,128)",
                            "tool_latency": "0.5 or U(0.2,1)"}  # fmt: skip
"""Keys that shape open-loop (rate) steps: they need `rates`."""


@dataclass(frozen=True)
class Target:
    url: str
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"


@dataclass(frozen=True)
class NamedWorkload:
    name: str
    spec: str


@dataclass(frozen=True)
class Engine:
    """Facts about the engine under test, recorded in the manifest config and the report."""

    model_full_name: str | None = None
    revision: str | None = None
    server_version: str | None = None
    hardware: str | None = None
    launch_args: str | None = None

    def metadata(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}


@dataclass(frozen=True)
class Campaign:
    target: Target
    workload: tuple[NamedWorkload, ...]
    name: str = "campaign"
    steps: tuple[int, ...] = (1, 2, 4, 8)  # () when the steps are rates
    rates: tuple[float, ...] = ()  # open loop: requests/s, one step each, instead of steps
    arrival: str = "poisson"
    turns: str = "1"  # sessions (docs/sessions.md): user turns per session, N or U(a,b)
    think_time: str = "0"
    history: str = "full"
    followup_workload: str = ""
    tool_rate: float = 0.0
    tool_latency: str = "0.5"
    max_concurrency: int = 0
    over_cap: str = "wait"  # wait | drop: an arrival over max_concurrency waits or is dropped
    search: str = "off"  # off | concurrency | rate: capacity search
    search_precision: float = 0.05
    search_min_requests: int = 100
    step_duration: float = 30.0
    step_warmup: float = 5.0
    cold_requests: int = 3
    events_uri: str = "runs"
    slo: str = ""
    fail_on_slo: bool = False
    workers: int | Literal["external"] = 2
    expect_workers: int = 2
    worker_wait: float = 60.0
    master_bind_host: str = "127.0.0.1"
    master_port: int = 0
    report_dir: str = "llmload-reports"
    engine: Engine = field(default_factory=Engine)
    extra: tuple[str, ...] = ()

    @property
    def external_workers(self) -> bool:
        return self.workers == EXTERNAL

    @property
    def local_workers(self) -> int:
        return 0 if self.workers == EXTERNAL else int(self.workers)

    @property
    def mode(self) -> Literal["concurrency", "rate"]:
        """Open loop ("rate": a step per entry of `rates`) or closed ("concurrency": `steps`)."""
        return "rate" if self.rates else "concurrency"

    @property
    def levels(self) -> tuple[float, ...]:
        """The steps' levels, in order: rates (requests/s) or concurrencies."""
        return self.rates or tuple(float(s) for s in self.steps)


def load_campaign(path: Path | str) -> Campaign:
    """Read a .yaml/.yml or .toml campaign file; UsageError names any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read campaign file {path}: {exc.strerror}") from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: not valid TOML ({exc})") from None
    elif suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            line = f" at line {where.line + 1}" if where is not None else ""
            raise UsageError(f"{path}: not valid YAML{line}; check the indentation") from None
    else:
        raise UsageError(f"{path}: campaign files end in .yaml, .yml or .toml")
    return parse_campaign(data, source=str(path))


def parse_campaign(data: Any, source: str = "campaign") -> Campaign:
    """Validate a parsed mapping into a Campaign."""
    _check_keys(data, source)
    top = _Section(data, source, "")
    target_sec = top.section("target", required=True)
    target = Target(
        url=target_sec.url("url"),
        model=target_sec.string("model", Target.model),
        api_key_env=target_sec.env_name("api_key_env", Target.api_key_env),
    )
    engine_sec = top.section("engine")
    engine = Engine(**{f.name: engine_sec.text_or_list(f.name) for f in fields(Engine)})
    workers = top.workers("workers")
    expect = top.integer("expect_workers", None, minimum=1)
    if workers != EXTERNAL:
        if expect is not None and expect != workers:
            top.fail("expect_workers", f"must equal workers ({workers}) or be left out")
        expect = int(workers)
    elif expect is None:
        top.fail("expect_workers", "is required with workers: external (how many to wait for)")
    rates = top.rates("rates")
    campaign = Campaign(
        target=target,
        workload=top.workloads("workload"),
        name=top.name("name", Campaign.name),
        steps=() if rates else top.steps("steps", Campaign.steps),
        rates=rates,
        arrival=top.arrival("arrival"),
        turns=top.session_option("turns", "--turns"),
        think_time=top.session_option("think_time", "--think-time"),
        history=top.session_option("history", "--history"),
        followup_workload=top.session_option("followup_workload", "--followup-workload"),
        tool_rate=top.fraction("tool_rate", Campaign.tool_rate, closed=True),
        tool_latency=top.session_option("tool_latency", "--tool-latency"),
        max_concurrency=top.integer("max_concurrency", Campaign.max_concurrency, minimum=0) or 0,
        over_cap=top.choice("over_cap", OVER_CAP, Campaign.over_cap),
        search=top.choice("search", SEARCH_MODES, Campaign.search),
        search_precision=top.fraction("search_precision", Campaign.search_precision),
        search_min_requests=top.integer(
            "search_min_requests", Campaign.search_min_requests, minimum=1
        )
        or Campaign.search_min_requests,
        step_duration=top.number("step_duration", Campaign.step_duration, positive=True),
        step_warmup=top.number("step_warmup", Campaign.step_warmup),
        cold_requests=top.integer("cold_requests", Campaign.cold_requests, minimum=0) or 0,
        events_uri=top.string("events_uri", Campaign.events_uri),
        slo=top.slo("slo"),
        fail_on_slo=top.boolean("fail_on_slo", Campaign.fail_on_slo),
        workers=workers,
        expect_workers=int(expect or 0),
        worker_wait=top.number("worker_wait", Campaign.worker_wait, positive=True),
        master_bind_host=top.string("master_bind_host", Campaign.master_bind_host),
        master_port=top.integer("master_port", Campaign.master_port, minimum=0, maximum=65535) or 0,
        report_dir=top.string("report_dir", Campaign.report_dir),
        engine=engine,
        extra=top.extra("extra"),
    )
    if campaign.step_warmup >= campaign.step_duration:
        top.fail("step_warmup", f"must be shorter than step_duration ({campaign.step_duration})")
    if campaign.fail_on_slo and not _has_objectives(campaign.slo):
        top.fail("fail_on_slo", "needs step objectives in slo, e.g. slo: ttft_p99=0.5")
    _check_open_loop(top, campaign)
    _check_search(top, campaign)
    _check_events_uri(top, campaign.events_uri)
    return campaign


def _check_open_loop(top: _Section, campaign: Campaign) -> None:
    """`rates` replaces `steps`; the open-loop keys need `rates`."""
    if campaign.rates and top.given("steps"):
        top.fail(
            "steps",
            "and key 'rates' are both set: give steps (concurrency) or rates (requests/s), "
            "not both",
        )
    if not campaign.rates:
        for key in OPEN_LOOP_KEYS:
            if top.given(key):
                top.fail(key, "applies to open-loop steps: give rates too, e.g. rates: [1, 2, 4]")


def _check_search(top: _Section, campaign: Campaign) -> None:
    """A search needs the levels of its mode and an SLO with a step objective to judge by."""
    if campaign.search == "off":
        return
    if campaign.search == "rate" and not campaign.rates:
        top.fail("search", "is rate: it needs rates (the coarse levels), e.g. rates: [1, 2, 4, 8]")
    if campaign.search == "concurrency" and campaign.rates:
        top.fail("search", "is concurrency: it searches steps, not rates; use search: rate")
    if not _has_objectives(campaign.slo):
        top.fail(
            "search",
            "needs slo with a step objective to judge each level by, e.g. slo: ttft_p99=0.5",
        )
    if campaign.fail_on_slo:
        top.fail(
            "fail_on_slo",
            "does not apply to a capacity search (levels above the capacity miss the SLO by "
            "design; the campaign exits 3 when even the lowest level misses it): remove it",
        )


def _has_objectives(spec: str) -> bool:
    from analysis.slo import parse_slo

    return bool(parse_slo(spec or None).objectives)


def _check_events_uri(top: _Section, uri: str) -> None:
    from analysis.storage import open_store

    try:
        open_store(uri)
    except UsageError as exc:
        top.fail("events_uri", str(exc))


class _Section:
    """One mapping of the file and typed getters for its keys (known keys: _check_keys)."""

    def __init__(self, data: Any, source: str, path: str) -> None:
        self.source, self.path = source, path
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            where = f"key {path!r}" if path else "the file"
            raise UsageError(f"{source}: {where} must be a mapping of keys, not {_kind(data)}")
        self.data: Mapping[str, Any] = data

    def fail(self, key: str, problem: str) -> NoReturn:
        raise UsageError(f"{self.source}: key {self._full(key)!r} {problem}")

    def _full(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def given(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _get(self, key: str, required: bool = False) -> Any:
        value = self.data.get(key)
        if value is None and required:
            self.fail(key, "is required")
        return value

    def section(self, key: str, required: bool = False) -> _Section:
        return _Section(self._get(key, required), self.source, self._full(key))

    def string(self, key: str, default: str) -> str:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.fail(key, f"must be a string, not {_kind(value)}; quote it")
        return str(value)

    def text_or_list(self, key: str) -> str | None:
        value = self._get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            import shlex

            return shlex.join(value)
        if value is not None and not isinstance(value, str | int | float):
            self.fail(key, f"must be a string, not {_kind(value)}")
        return None if value is None else str(value)

    def url(self, key: str) -> str:
        value = self.string(key, "")
        if not value:
            self.fail(key, "is required: the server's base URL, e.g. http://127.0.0.1:8000")
        if not re.match(r"^https?://[^/\s]+", value):
            self.fail(key, f"must be an http:// or https:// base URL, not {value!r}")
        return value.rstrip("/")

    def env_name(self, key: str, default: str) -> str:
        value = self.string(key, default)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            self.fail(
                key, f"must name an environment variable (e.g. OPENAI_API_KEY), not {value!r}"
            )
        return value

    def name(self, key: str, default: str) -> str:
        value = self.string(key, default)
        if not NAME_PATTERN.match(value):
            self.fail(
                key, f"must be letters, digits, '.', '_' or '-' (it goes in run ids), not {value!r}"
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, not {value!r}")
        return bool(value)

    def number(self, key: str, default: float, positive: bool = False) -> float:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, f"must be a number of seconds, not {value!r}")
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "> 0" if positive else ">= 0"
            self.fail(key, f"must be {bound}, not {value}; give seconds, e.g. {key}: {default:g}")
        return float(value)

    def integer(
        self, key: str, default: int | None, minimum: int, maximum: int | None = None
    ) -> int | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an integer, not {value!r}")
        if value < minimum:
            self.fail(key, f"must be >= {minimum}, not {value}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {maximum}, not {value}")
        return int(value)

    def workers(self, key: str) -> int | Literal["external"]:
        value = self._get(key)
        if value is None:
            return Campaign.workers
        if value == EXTERNAL:
            return EXTERNAL
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fail(key, f"must be a number of local workers >= 1 or 'external', not {value!r}")
        return int(value)

    def steps(self, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = self._get(key)
        if value is None:
            return default
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            self.fail(key, f"must be a list of concurrencies such as [1, 2, 4], not {value!r}")
        try:
            steps = tuple(int(str(s).strip()) for s in items if not isinstance(s, bool | float))
        except ValueError:
            steps = ()
        if len(steps) != len(items) or any(s < 1 for s in steps):
            self.fail(key, f"must be a list of integers >= 1 such as [1, 2, 4], not {value!r}")
        return steps

    def rates(self, key: str) -> tuple[float, ...]:
        value = self._get(key)
        if value is None:
            return ()
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            self.fail(key, f"must be a list of requests/s such as [0.5, 1, 2], not {value!r}")
        rates: list[float] = []
        for item in items:
            try:
                rate = math.nan if isinstance(item, bool) else float(str(item).strip())
            except ValueError:
                rate = math.nan
            if not (math.isfinite(rate) and rate > 0):
                self.fail(
                    key,
                    f"must be a list of numbers > 0 (requests/s) such as [0.5, 1, 2], "
                    f"not {value!r}",
                )
            rates.append(rate)
        return tuple(rates)

    def session_option(self, key: str, flag: str) -> str:
        """A session option (a number or a text), checked by the option's own parser."""
        from locustfiles.run.options import parse_history
        from locustfiles.traffic.spread import parse_spread
        from locustfiles.traffic.workloads import parse_workload

        default = str(getattr(Campaign, key))
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            self.fail(key, f"must be a number or a string such as {_SESSION_EXAMPLES[key]}")
        text = str(value).strip()
        try:
            if key == "history":
                parse_history(text)
            elif key == "followup_workload":
                if text.startswith("conversations:"):
                    raise UsageError("takes lengths (D/N/U) or dataset:PATH.jsonl")
                parse_workload(text)
            else:
                parse_spread(flag, text, integer=key == "turns")
        except UsageError as exc:
            problem = str(exc).removeprefix(f"{flag} {text!r}: ").removeprefix(f"{flag} ")
            self.fail(key, f"is not valid ({problem}); e.g. {_SESSION_EXAMPLES[key]}")
        return text

    def arrival(self, key: str) -> str:
        from locustfiles.run.options import parse_arrival

        value = self.string(key, Campaign.arrival)
        try:
            return parse_arrival(value)
        except UsageError:
            self.fail(
                key,
                "must be poisson, constant or gamma:CV with CV > 0 "
                f"(e.g. gamma:2 for bursty arrivals), not {value!r}",
            )

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self._get(key)
        if value is None:
            return default
        if value is False and "off" in choices:
            return "off"  # YAML 1.1 reads a bare `off` as false
        if value not in choices:
            self.fail(key, f"must be {' or '.join(choices)}, not {value!r}")
        return str(value)

    def fraction(self, key: str, default: float, closed: bool = False) -> float:
        """A number between 0 and 1: exclusive, or with `closed` inclusive."""
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, f"must be a number between 0 and 1 such as 0.05, not {value!r}")
        inside = 0 <= value <= 1 if closed else 0 < value < 1
        if not (math.isfinite(value) and inside):
            bounds = "inclusive" if closed else "exclusive"
            self.fail(key, f"must be between 0 and 1 ({bounds}) such as 0.05, not {value}")
        return float(value)

    def workloads(self, key: str) -> tuple[NamedWorkload, ...]:
        value = self._get(key, required=True)
        if isinstance(value, str):
            return (NamedWorkload("default", self._spec(key, value)),)
        if not isinstance(value, list) or not value:
            self.fail(key, "must be a spec such as 'D(128,64)' or a list of {name, spec}")
        out: list[NamedWorkload] = []
        for i, item in enumerate(value):
            sec = _Section(item, self.source, f"{self._full(key)}[{i}]")
            name = sec.name("name", "")
            spec = sec.string("spec", "")
            if not name or not spec:
                sec.fail("name" if not name else "spec", "is required in every workload entry")
            out.append(NamedWorkload(name, self._spec(f"{key}[{i}].spec", spec)))
        names = [w.name for w in out]
        if len(set(names)) != len(names):
            self.fail(key, f"has duplicate names: {names}; give each workload its own name")
        return tuple(out)

    def _spec(self, key: str, spec: str) -> str:
        from locustfiles.traffic.workloads import parse_workload

        try:
            parse_workload(spec)
        except UsageError as exc:
            self.fail(key, f"is not a valid workload: {exc}")
        return spec

    def slo(self, key: str) -> str:
        from analysis.slo import parse_slo

        value = self.string(key, "")
        try:
            parse_slo(value or None)
        except UsageError as exc:
            self.fail(key, f"is not a valid SLO: {exc}")
        return value

    def extra(self, key: str) -> tuple[str, ...]:
        value = self._get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
            self.fail(key, "must be a list of Locust arguments, e.g. ['--stop-timeout', '10']")
        args = tuple(str(v) for v in value)
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag in OWNED_FLAGS:
                self.fail(key, f"sets {flag}, which the campaign controls: use {OWNED_FLAGS[flag]}")
        return args


# Keys a file must give, by section; the other keys of each section have defaults.
REQUIRED: Final = {"": ("target", "workload"), "target": ("url",), "workload[]": ("name", "spec")}


def _check_keys(data: Any, source: str) -> None:
    """Every unknown key and every missing required key of the file, named in one line.

    Runs before any value is checked, so one correction round fixes every key.
    """
    unknown: list[str] = []
    missing: list[str] = []

    def visit(mapping: Any, cls: type, path: str, required: tuple[str, ...] = ()) -> None:
        if not isinstance(mapping, Mapping):
            return  # a value that is not a mapping is reported by _Section
        known = [f.name for f in fields(cls)]
        prefix = f"{path}." if path else ""
        for key in map(str, mapping):
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                unknown.append(f"{prefix + key!r}{hint}")
        missing.extend(repr(prefix + k) for k in required if mapping.get(k) is None)

    visit(data, Campaign, "", REQUIRED[""])
    if isinstance(data, Mapping):
        visit(data.get("target"), Target, "target", REQUIRED["target"])
        visit(data.get("engine"), Engine, "engine")
        workloads = data.get("workload")
        for i, item in enumerate(workloads if isinstance(workloads, list) else []):
            visit(item, NamedWorkload, f"workload[{i}]", REQUIRED["workload[]"])
    problems = []
    if unknown:
        problems.append(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    if missing:
        problems.append(
            f"missing required key{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        )
    if problems:
        raise UsageError(f"{source}: {'; '.join(problems)} (docs/campaign-config.md)")


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


__all__ = ["EXTERNAL", "Campaign", "Engine", "NamedWorkload", "Target", "load_campaign"]
