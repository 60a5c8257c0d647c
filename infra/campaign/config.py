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
import itertools
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import reduce
from pathlib import Path
from typing import Any, Final, Literal, NoReturn

from analysis.kernel.errors import UsageError
from locustfiles.options.kinds import Checked, Count, Kind, Seconds, Switch
from locustfiles.options.parsers import base_url_problem, has_step_objectives, local_folder
from locustfiles.options.rules import check_together
from locustfiles.options.table import OPTION, TABLE
from locustfiles.options.voice import FileVoice, shown

EXTERNAL: Final = "external"
AUTO: Final = "auto"
"""`workers_per_host: auto`: one local worker process per CPU this process may use."""
WORKERS_KEYS: Final = ("workers_per_host", "workers")
"""The key of the local worker processes, and its older name (still read; not both)."""
MAX_REPEAT: Final = 1000
"""`repeat` (and `--repeat`) at most: each repeat is a whole run of every workload."""
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

CHAT_OPTIONS: Final = tuple(o for o in TABLE if o.key and o.name != "workload")
"""The chat options a file sets by key (table.py), read with the option's own kind and checks;
`workload` is read apart (one spec, or a list of named ones: one run each)."""

# Options the campaign sets itself: in `extra` they would contradict the file.
OWNED_FLAGS: Final = {
    **{option.flag: option.key for option in TABLE if option.key},
    "--host": "target.url", "-H": "target.url", "--run-id": "name", "--metadata": "engine",
    "--master": "workers_per_host", "--worker": "workers_per_host",
    "--expect-workers": "workers_per_host", "--processes": "workers_per_host",
    "--master-bind-host": "master_bind_host", "--master-bind-port": "master_port",
    "--headless": "(always headless)",
    "-f": "(the llmload locustfile)", "--locustfile": "(the llmload locustfile)",
}  # fmt: skip


def _default(name: str) -> Any:
    """A chat option's default in campaign files (table.py)."""
    return OPTION[name].file_default


@dataclass(frozen=True)
class Target:
    url: str
    model: str = _default("model")
    api_key_env: str = _default("api_key_env")


@dataclass(frozen=True)
class NamedWorkload:
    name: str
    spec: str


METADATA_KEYS: Final = ("model_full_name", "revision", "server_version", "hardware",
                        "launch_args")  # fmt: skip
"""`engine` keys that are facts about the engine, recorded in each run's manifest config."""


@dataclass(frozen=True)
class EngineConfig:
    """One configuration of an engine sweep (docs/sweeps.md): the flags added to the engine's
    command and its environment, or the URL of an engine someone else started."""

    name: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""  # an engine already running: nothing is started
    accelerators: int = 0  # 0: the engine's (engine.accelerators)

    @property
    def started(self) -> bool:
        """Whether llmload starts this configuration's engine (no `url`)."""
        return not self.url


@dataclass(frozen=True)
class Engine:
    """The engine under test: facts recorded in the manifest config and the report, and,
    for a sweep, how to start it and the configurations to run the plan against."""

    model_full_name: str | None = None
    revision: str | None = None
    server_version: str | None = None
    hardware: str | None = None
    launch_args: str | None = None
    command: tuple[str, ...] = ()  # starts the engine; {host} and {port} are filled in
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port for each configuration ({port} in the command)
    ready_path: str = "/v1/models"
    ready_timeout: float = 600.0
    stop_timeout: float = 30.0
    accelerators: int = 0  # accelerators one engine uses (--accelerators); 0: unknown
    sweep: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # flag -> values, in file order
    configurations: tuple[EngineConfig, ...] = ()

    def metadata(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in METADATA_KEYS if getattr(self, k)}

    @property
    def is_sweep(self) -> bool:
        """Whether the campaign runs its plan once per engine configuration (docs/sweeps.md)."""
        return bool(self.command or self.configurations)

    def plan(self) -> tuple[EngineConfig, ...]:
        """The configurations in order: the file's list, the `sweep` matrix (every
        combination, the first flag varying slowest), or the command alone ("default")."""
        if self.configurations:
            return self.configurations
        if not self.sweep:
            return (EngineConfig("default"),)
        flags = [flag for flag, _ in self.sweep]
        out = []
        for values in itertools.product(*(values for _, values in self.sweep)):
            args: list[str] = []
            for flag, value in zip(flags, values, strict=True):
                args += flag_args(flag, value)
            name = ".".join(
                f"{flag}-{_name_text(value)}" for flag, value in zip(flags, values, strict=True)
            )
            out.append(EngineConfig(_safe_name(name), tuple(args)))
        return tuple(out)


def flag_args(flag: str, value: Any) -> list[str]:
    """A sweep value as command-line arguments: true `--flag`, false `--no-flag` (vLLM's
    boolean flags), anything else `--flag VALUE`."""
    if value is True:
        return [f"--{flag}"]
    if value is False:
        return [f"--no-{flag}"]
    return [f"--{flag}", _name_text(value)]


def _name_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _safe_name(text: str) -> str:
    """A configuration's name as run ids and folders take it (NAME_PATTERN)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "config"
    return name[:64]


@dataclass(frozen=True)
class Campaign:
    """A campaign file's keys. Those of chat options (CHAT_OPTIONS) hold the option's setting,
    with the option's default; docs/campaign-config.md says what each key means."""

    target: Target
    workload: tuple[NamedWorkload, ...]
    name: str = "campaign"
    steps: tuple[int, ...] = _default("steps")  # () when the steps are rates
    rates: tuple[float, ...] = _default("rates")
    arrival: str = _default("arrival")
    turns: str = _default("turns")
    think_time: str = _default("think_time")
    history: str = _default("history")
    followup_workload: str = _default("followup_workload")
    tool_rate: float = _default("tool_rate")
    tool_latency: str = _default("tool_latency")
    response_format: str = _default("response_format")
    max_concurrency: int = _default("max_concurrency")
    over_cap: str = _default("over_cap")
    search: str = _default("search")
    search_precision: float = _default("search_precision")
    search_min_requests: int = _default("search_min_requests")
    stop_when: str = _default("stop_when")
    stop_ttft_factor: float = _default("stop_ttft_factor")
    stop_min_growth: float = _default("stop_min_growth")
    stop_overload_rate: float = _default("stop_overload_rate")
    step_duration: float = _default("step_duration")
    step_warmup: float = _default("step_warmup")
    cold_requests: int = _default("cold_requests")
    events_uri: str = _default("events_uri")
    slo: str = _default("slo")
    trace_format: str = _default("trace_format")
    trace_speedup: str = _default("trace_speedup")
    trace_start: float = _default("trace_start")
    trace_duration: float = _default("trace_duration")
    trace_block_tokens: int = _default("trace_block_tokens")
    prefix_groups: int = _default("prefix_groups")
    prefix_tokens: int = _default("prefix_tokens")
    cache_phase: str = _default("cache_phase")
    engine_block_size: int = _default("engine_block_size")
    otlp_listen: str = _default("otlp_listen")
    otlp_linger: float = _default("otlp_linger")
    accelerator_metrics: str = _default("accelerator_metrics")
    accelerators: int = _default("accelerators")
    accelerator_hour_price: float = _default("accelerator_hour_price")
    fail_on_slo: bool = False
    repeat: int = 1  # runs of each workload (the same plan; new run ids, one campaign id)
    # Local worker processes: N, AUTO (one per usable CPU) or EXTERNAL (started elsewhere).
    workers_per_host: int | Literal["auto", "external"] = AUTO
    expect_workers: int = 0  # unless external: always local_workers (__post_init__)
    worker_wait: float = 60.0
    master_bind_host: str = "127.0.0.1"
    master_port: int = 0
    report_dir: str = "llmload-reports"
    engine: Engine = field(default_factory=Engine)
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.external_workers:  # the master waits for the workers it starts itself
            object.__setattr__(self, "expect_workers", local_count(self.workers_per_host))

    @property
    def external_workers(self) -> bool:
        return self.workers_per_host == EXTERNAL

    @property
    def local_workers(self) -> int:
        """Worker processes the campaign starts on this host (`auto`: one per usable CPU)."""
        return 0 if self.external_workers else self.expect_workers

    @property
    def mode(self) -> Literal["concurrency", "rate"]:
        """Open loop ("rate": a step per entry of `rates`) or closed ("concurrency": `steps`)."""
        return "rate" if self.rates else "concurrency"

    @property
    def levels(self) -> tuple[float, ...]:
        """The steps' levels, in order: rates (requests/s) or concurrencies."""
        return self.rates or tuple(float(s) for s in self.steps)

    def settings(self) -> dict[str, Any]:
        """The chat options' settings, by option name (the master's command line)."""
        return {o.name: reduce(getattr, str(o.key).split("."), self) for o in CHAT_OPTIONS}


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (`taskset`, `docker run
    --cpuset-cpus` narrow it; a CPU quota such as `docker run --cpus` does not), else the
    machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def local_count(setting: int | Literal["auto", "external"]) -> int:
    """The local worker processes a `workers_per_host` setting starts on this host."""
    if setting == EXTERNAL:
        return 0
    return usable_cpus() if setting == AUTO else int(setting)


def workers_setting(
    value: Any, voice: FileVoice | None = None
) -> int | Literal["auto", "external"]:
    """A `workers_per_host` value (a file's, or `--workers`'s text): N >= 1, 'auto' or
    'external'; UsageError otherwise."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value == AUTO:
        return AUTO
    if value == EXTERNAL:
        return EXTERNAL
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problem = (f"must be a number of local worker processes >= 1, 'auto' (one per CPU) "
                   f"or 'external', not {value!r}")  # fmt: skip
        if voice is None:
            raise UsageError(problem)
        voice.fail(problem)
    return int(value)


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
    sets_url = _starts_engines(data.get("engine") if isinstance(data, Mapping) else None)
    if sets_url and target_sec.data.get("url") is not None:
        target_sec.fail(
            "url",
            "is set for each configuration by the engine section (its "
            "command's host and port, or each configuration's url): remove it",
        )
    url = "" if sets_url else target_sec.url("url")
    engine = top.section("engine").engine()
    key, workers = top.workers()
    expect = top.get("expect_workers", Count(minimum=1), None)
    if workers != EXTERNAL:
        local = local_count(workers)
        if expect is not None and expect != local:
            said = f"auto: {local} here" if workers == AUTO else str(workers)
            top.fail("expect_workers", f"must equal {key} ({said}) or be left out")
    elif expect is None:
        top.fail("expect_workers", f"is required with {key}: external (how many to wait for)")
    settings, given = _chat_settings(data, source)
    keys = {str(OPTION[name].key): value for name, value in settings.items()}
    campaign = Campaign(
        target=Target(url, keys.pop("target.model"), keys.pop("target.api_key_env")),
        workload=top.workloads("workload"),
        name=top.name("name", Campaign.name),
        **keys,
        fail_on_slo=top.get("fail_on_slo", Switch(), Campaign.fail_on_slo),
        repeat=top.get("repeat", Count(minimum=1, maximum=MAX_REPEAT), Campaign.repeat),
        workers_per_host=workers,
        expect_workers=int(expect or 0),
        worker_wait=top.get("worker_wait", Seconds(), Campaign.worker_wait),
        master_bind_host=top.get("master_bind_host", Kind(), Campaign.master_bind_host),
        master_port=top.get("master_port", Count(minimum=0, maximum=65535), Campaign.master_port),
        report_dir=top.get("report_dir", Checked(local_folder("report_dir")), Campaign.report_dir),
        engine=engine,
        extra=top.extra("extra"),
    )
    check_together(settings, given.__contains__, lambda name: OPTION[name].file(source))
    if campaign.fail_on_slo and not has_step_objectives(campaign.slo):
        top.fail("fail_on_slo", "needs step objectives in slo, e.g. slo: ttft_p99=0.5")
    if campaign.fail_on_slo and campaign.search != "off":
        top.fail(
            "fail_on_slo",
            "does not apply to a capacity search (levels above the capacity miss the SLO by "
            "design; the campaign exits 3 when even the lowest level misses it): remove it",
        )
    return campaign


def _chat_settings(data: Mapping[str, Any], source: str) -> tuple[dict[str, Any], set[str]]:
    """The chat options' settings by option name, and the names whose key the file gives."""
    settings: dict[str, Any] = {}
    given: set[str] = set()
    for option in CHAT_OPTIONS:
        raw: Any = data
        for part in str(option.key).split("."):
            raw = raw.get(part) if isinstance(raw, Mapping) else None
        if raw is None:
            settings[option.name] = option.file_default
        else:
            given.add(option.name)
            settings[option.name] = option.kind.setting(raw, option.file(source))
    if settings["rates"]:
        settings["steps"] = ()  # rates replace the steps
    return settings, given


class _Section:
    """One mapping of the file and getters for its campaign keys (known keys: _check_keys)."""

    def __init__(self, data: Any, source: str, path: str) -> None:
        self.source, self.path = source, path
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            where = f"key {path!r}" if path else "the file"
            raise UsageError(f"{source}: {where} must be a mapping of keys, not {shown(data)}")
        self.data: Mapping[str, Any] = data

    def say(self, key: str, default: Any = None) -> FileVoice:
        return FileVoice(self.source, f"{self.path}.{key}" if self.path else key, default)

    def fail(self, key: str, problem: str) -> NoReturn:
        self.say(key).fail(problem)

    def get(self, key: str, kind: Kind, default: Any) -> Any:
        """The key's value checked by `kind` (kinds.py), or `default` when left out."""
        value = self.data.get(key)
        return default if value is None else kind.value(value, self.say(key, default))

    def _required(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None:
            self.fail(key, "is required")
        return value

    def section(self, key: str, required: bool = False) -> _Section:
        value = self._required(key) if required else self.data.get(key)
        return _Section(value, self.source, self.say(key).ref)

    def text_or_list(self, key: str) -> str | None:
        value = self.data.get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return shlex.join(value)
        if value is not None and not isinstance(value, str | int | float):
            self.fail(key, f"must be a string, not {shown(value)}")
        return None if value is None else str(value)

    def url(self, key: str) -> str:
        value = self.get(key, Kind(), "")
        if not value:
            self.fail(key, "is required: the server's base URL, e.g. http://127.0.0.1:8000")
        if not re.match(r"^https?://[^/\s]+", value):
            self.fail(key, f"must be an http:// or https:// base URL, not {value!r}")
        found = base_url_problem(value)  # a path or a query: refused as `--host` refuses it
        if found is not None:
            fix = f"{key}: {found[1]!r}, " if found[1] else ""
            self.fail(key, f"{found[0]}: {fix}not {value!r}")
        return str(value).rstrip("/")

    def name(self, key: str, default: str) -> str:
        value = self.get(key, Kind(), default)
        if not NAME_PATTERN.match(value):
            self.fail(
                key, f"must be letters, digits, '.', '_' or '-' (it goes in run ids), not {value!r}"
            )
        return str(value)

    def workers(self) -> tuple[str, int | Literal["auto", "external"]]:
        """The key given (`workers_per_host`, or its old name `workers`) and its value."""
        given = [key for key in WORKERS_KEYS if self.data.get(key) is not None]
        if len(given) > 1:
            self.fail("workers", "and 'workers_per_host' are one setting (workers is its old "
                      "name): keep only workers_per_host")  # fmt: skip
        if not given:
            return WORKERS_KEYS[0], Campaign.workers_per_host
        return given[0], workers_setting(self.data[given[0]], self.say(given[0]))

    def workloads(self, key: str) -> tuple[NamedWorkload, ...]:
        value = self._required(key)
        if isinstance(value, str):
            return (NamedWorkload("default", self._spec(key, value)),)
        if not isinstance(value, list) or not value:
            self.fail(key, "must be a spec such as 'D(128,64)' or a list of {name, spec}")
        out: list[NamedWorkload] = []
        for i, item in enumerate(value):
            sec = _Section(item, self.source, f"{self.say(key).ref}[{i}]")
            name = sec.name("name", "")
            spec = sec.get("spec", Kind(), "")
            if not name or not spec:
                sec.fail("name" if not name else "spec", "is required in every workload entry")
            out.append(NamedWorkload(name, self._spec(f"{key}[{i}].spec", spec)))
        names = [w.name for w in out]
        if len(set(names)) != len(names):
            self.fail(key, f"has duplicate names: {names}; give each workload its own name")
        return tuple(out)

    def _spec(self, key: str, spec: str) -> str:
        option = OPTION["workload"]
        return str(option.kind.setting(spec, option.file(self.source, self.say(key).ref)))

    def args(self, key: str) -> tuple[str, ...]:
        """A command line: a string (split shell-style) or a list of strings and numbers."""
        value = self.data.get(key)
        if value is None:
            return ()
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                self.fail(key, f"is not a shell command line ({exc}); check its quotes")
        if not isinstance(value, list) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
        ):
            self.fail(key, "must be a command line: a string, or a list of strings")
        return tuple(str(v) for v in value)

    def environment(self, key: str) -> dict[str, str]:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool) for v in value.values()
        ):
            self.fail(key, "must be a mapping of environment variables to strings, "
                      "e.g. {VLLM_CPU_KVCACHE_SPACE: '1'}")  # fmt: skip
        return {str(k): str(v) for k, v in value.items()}

    def engine(self) -> Engine:
        """The `engine` section: its facts, and how a sweep starts and varies the engine."""
        command = self.args("command")
        base = Engine(
            model_full_name=self.text_or_list("model_full_name"),
            revision=self.text_or_list("revision"),
            server_version=self.text_or_list("server_version"),
            hardware=self.text_or_list("hardware"),
            launch_args=self.text_or_list("launch_args"),
            command=command,
            env=self.environment("env"),
            host=self.get("host", Kind(), Engine.host),
            port=self.get("port", Count(minimum=0, maximum=65535), Engine.port),
            ready_path=self.get("ready_path", Kind(), Engine.ready_path),
            ready_timeout=self.get("ready_timeout", Seconds(), Engine.ready_timeout),
            stop_timeout=self.get("stop_timeout", Seconds(), Engine.stop_timeout),
            accelerators=self.get("accelerators", Count(minimum=0), Engine.accelerators),
        )
        if not base.ready_path.startswith("/"):
            self.fail("ready_path", f"must be a path starting with '/', not {base.ready_path!r}")
        sweep = self.matrix("sweep")
        configurations = self.configurations("configurations")
        if sweep and configurations:
            self.fail("sweep", "and configurations are two ways to list the configurations: "
                      "keep one")  # fmt: skip
        if sweep and not command:
            self.fail("sweep", "needs engine.command: the command the flags are added to")
        if command and base.port == 0 and not any("{port}" in arg for arg in command):
            self.fail("command", "must place the port llmload picks: add {port} (e.g. "
                      "'--port {port}'), or give engine.port")  # fmt: skip
        for i, config in enumerate(configurations):
            if config.started and not command:
                self.fail(f"configurations[{i}]", "needs engine.command to start it, or a url "
                          "of an engine already running")  # fmt: skip
        return replace(base, sweep=sweep, configurations=configurations)

    def matrix(self, key: str) -> tuple[tuple[str, tuple[Any, ...]], ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, Mapping) or not value:
            self.fail(key, "must map engine flags to lists of values, e.g. "
                      "{max-num-seqs: [1, 4, 8]}")  # fmt: skip
        out = []
        for flag, values in value.items():
            name = str(flag).lstrip("-")
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
                self.fail(key, f"flag {flag!r} is not an engine flag name such as max-num-seqs")
            if isinstance(values, str | int | float):
                values = [values]
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, str | int | float) for v in values)
            ):
                self.fail(f"{key}.{flag}", "must be a list of values, e.g. [1, 4, 8]")
            out.append((name, tuple(values)))
        return tuple(out)

    def configurations(self, key: str) -> tuple[EngineConfig, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not value:
            self.fail(key, "must be a list of {name, args, env, url, accelerators}")
        out = []
        for i, item in enumerate(value):
            sec = _Section(item, self.source, f"{self.say(key).ref}[{i}]")
            url = sec.url("url") if sec.data.get("url") is not None else ""
            if url and (sec.data.get("args") is not None or sec.data.get("env") is not None):
                sec.fail("url", "names an engine already running: args and env cannot apply")
            out.append(EngineConfig(
                name=sec.name("name", ""), args=sec.args("args"), env=sec.environment("env"),
                url=url, accelerators=sec.get("accelerators", Count(minimum=0), 0),
            ))  # fmt: skip
        names = [c.name for c in out]
        if len(set(names)) != len(names):
            self.fail(key, f"has duplicate names: {names}; give each configuration its own name")
        return tuple(out)

    def extra(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
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


def _starts_engines(engine: Any) -> bool:
    """Whether a file's raw `engine` section makes it a sweep (Engine.is_sweep, before the
    section is validated): each configuration's engine then gives the target's URL."""
    return isinstance(engine, Mapping) and bool(
        engine.get("command") or engine.get("configurations")
    )


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
        if cls is Campaign:
            known += WORKERS_KEYS[1:]  # old names still read
        prefix = f"{path}." if path else ""
        for key in map(str, mapping):
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                unknown.append(f"{prefix + key!r}{hint}")
        missing.extend(repr(prefix + k) for k in required if mapping.get(k) is None)

    visit(data, Campaign, "", REQUIRED[""])
    if isinstance(data, Mapping):
        engine = data.get("engine")
        starts = _starts_engines(engine)
        visit(data.get("target"), Target, "target", () if starts else REQUIRED["target"])
        visit(engine, Engine, "engine")
        configurations = engine.get("configurations") if isinstance(engine, Mapping) else None
        for i, item in enumerate(configurations if isinstance(configurations, list) else []):
            visit(item, EngineConfig, f"engine.configurations[{i}]", ("name",))
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


__all__ = [
    "AUTO",
    "EXTERNAL",
    "Campaign",
    "Engine",
    "EngineConfig",
    "NamedWorkload",
    "Target",
    "load_campaign",
]
