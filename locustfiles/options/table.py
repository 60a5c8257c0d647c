"""The chat options, each declared once: flag, campaign key, kind, default and help.

    OPTION["step_duration"].flag, .key, .default, .kind.value(raw, say)
    add_arguments(parser)          # Locust's parser (LOCUST_<NAME> variables, web UI form)
    command_line(settings)         # the flags that hand a campaign's settings to its master

One table serves three readers: Locust's parser (add_arguments), campaign files (the keys in
`key`, read by infra/campaign/config.py with the same kinds and checks) and the campaign
runner (command_line). Checks between options are rules.py's, for both paths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

from locustfiles.options.kinds import (
    Amount,
    Checked,
    Choice,
    Count,
    Factor,
    Fraction,
    Json,
    Kind,
    Levels,
    Seconds,
    Spec,
    Switch,
)
from locustfiles.options.parsers import (
    check_events_uri,
    check_extra_body,
    check_slo,
    local_folder,
    parse_accelerator_source,
    parse_arrival,
    parse_env_name,
    parse_followup,
    parse_history,
    parse_listen,
    parse_rates,
    parse_run_id,
    parse_steps,
)
from locustfiles.options.tracerun import parse_speedup
from locustfiles.options.voice import CliVoice, FileVoice, as_arg
from locustfiles.request.validity import parse_response_format
from locustfiles.traffic.models import check_model_mix
from locustfiles.traffic.spread import parse_spread
from locustfiles.traffic.workloads import parse_workload


@dataclass(frozen=True)
class Option:
    """One option. `key`: its key in campaign files (None: a file sets it through `extra`);
    `in_files`: its default there where that differs. The runner passes an option that
    `needs` another only while that one is on, one that is `always` passed even at its
    default, any other only where it differs from its default."""

    flag: str
    default: Any
    kind: Kind
    help: str
    key: str | None = None
    in_files: Any = None
    always: bool = False
    needs: str | None = None

    @property
    def name(self) -> str:
        """The attribute on Locust's parsed options, e.g. step_duration."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env_var(self) -> str:
        return "LOCUST_" + self.name.upper()

    def arguments(self) -> dict[str, Any]:
        """Keywords for argparse's add_argument."""
        return {"default": self.default, "help": self.help, **self.kind.arguments()}

    def cli(self) -> CliVoice:
        return CliVoice(self.flag, self.default)

    def file(self, source: str, key: str | None = None) -> FileVoice:
        return FileVoice(source, key or self.key or self.name, self.file_default, self.flag)

    @cached_property
    def default_setting(self) -> Any:
        """The default as a setting (e.g. the steps (1, 2, 4, 8), not the text "1,2,4,8")."""
        return self.kind.setting(self.default, self.cli())

    @property
    def file_default(self) -> Any:
        """The setting a campaign file gets when it leaves the key out."""
        return self.default_setting if self.in_files is None else self.in_files


def _text(parse: Callable[[str], Any]) -> Callable[[str, str], Any]:
    """A parser of the text alone, for a Spec (whose parsers get the flag too)."""
    return lambda _flag, text: parse(text)


_SPREAD = "S, U(a,b), N(mean,sd) or exp(mean)"
_ON_OFF = Choice(("on", "off"))
_AUTO = Choice(("auto", "on", "off"))

# Help texts are the documentation: README lists every flag.
TABLE: tuple[Option, ...] = (
    Option("--model", "", Checked(check_model_mix, "is not a valid model mix: {error}"),
           "model id to request (default: first id from /v1/models), or a mix picked per "
           "request: a:0.7,b:0.3 (weights normalised; a,b: equal shares)",
           key="target.model", always=True),
    Option("--api-key-env", "OPENAI_API_KEY",
           Checked(parse_env_name, "must name an environment variable (e.g. OPENAI_API_KEY), not {value!r}"),
           "name of the environment variable holding the API key (sent as a Bearer token)",
           key="target.api_key_env", always=True),
    Option("--endpoint", "chat", Choice(("chat", "completions", "responses", "messages")),
           "chat: /v1/chat/completions, completions: /v1/completions, responses: the OpenAI "
           "Responses API (/v1/responses), messages: Anthropic-style Messages (/v1/messages)"),
    Option("--no-stream", False, Switch(), "send non-streaming requests (TTFT then equals E2E)"),
    Option("--workload", "D(128,64)",
           Spec(_text(parse_workload), "D(128,64)", numbers=False, in_file="is not a valid workload: {error}"),
           "length mix: D(in,out), N(m,sd)/(m,sd), U(a,b)/(a,b), weighted sums, dataset:PATH.jsonl, "
           "or trace:PATH (replay a recorded trace, --trace-*)",
           key="workload", always=True),
    Option("--turns", "1", Spec(partial(parse_spread, integer=True), "3 or U(2,5)"),
           "sessions: turns per conversation, N or U(a,b) (1: single requests)", key="turns"),
    Option("--think-time", "0", Spec(parse_spread, "2 or exp(2)"),
           f"sessions: seconds between a reply and the next user turn: {_SPREAD}", key="think_time"),
    Option("--history", "full", Spec(_text(parse_history), "full or window:4"),
           "sessions: each turn resends the whole conversation (full) or its last N turns (window:N)",
           key="history"),
    Option("--followup-workload", "", Spec(_text(parse_followup), "D(64,128)"),
           "sessions: length mix of the turns after the first (default: --workload)",
           key="followup_workload"),
    Option("--tool-rate", 0.0, Fraction(0.3, "three turns in ten"),
           "agents: fraction of turns whose request offers tools; a tool call is answered after --tool-latency",
           key="tool_rate"),
    Option("--tool-latency", "0.5", Spec(parse_spread, "0.5 or U(0.2,1)"),
           f"agents: seconds a tool takes before its result is sent: {_SPREAD}", key="tool_latency"),
    Option("--steps", "1,2,4,8", Levels(parse_steps, "concurrencies", "integers >= 1", "[1, 2, 4]"),
           "comma-separated target concurrencies, one step each", key="steps", always=True),
    Option("--rates", "",
           Levels(parse_rates, "requests/s", "numbers > 0 (requests/s)", "[0.5, 1, 2]"),
           "open loop: comma-separated arrival rates (requests/s, 0.001 to 100,000), one step each, "
           "instead of --steps",
           key="rates", always=True),
    Option("--arrival", "poisson", Checked(parse_arrival, "{problem}, not {value!r}"),
           "open loop: arrival process of --rates: poisson, constant or gamma:CV (CV > 1 is burstier; "
           "at most 10)",
           key="arrival", needs="rates"),
    Option("--max-concurrency", 0, Count(minimum=0),
           "open loop: cap on requests in flight across all workers (0: no cap)",
           key="max_concurrency", needs="rates"),
    Option("--over-cap", "wait", Choice(("wait", "drop")),
           "open loop: an arrival over --max-concurrency waits for a slot, or is dropped (counted)",
           key="over_cap", needs="rates"),
    Option("--trace-format", "auto", Choice(("auto", "mooncake", "azure", "burstgpt")),
           "trace replay: the format of --workload trace:PATH (auto: detected from its first line)", key="trace_format"),
    Option("--trace-speedup", "1", Spec(_text(parse_speedup), "10"),
           "trace replay: how many times faster than recorded the trace's arrivals come (10: ten times)", key="trace_speedup"),
    Option("--trace-start", 0.0, Seconds(positive=False),
           "trace replay: seconds into the trace (from its first request) where the replayed window starts", key="trace_start"),
    Option("--trace-duration", 0.0, Seconds(positive=False),
           "trace replay: seconds of the trace (before the speedup) replayed from --trace-start (0: to the end)", key="trace_duration"),
    Option("--trace-block-tokens", 512, Count(minimum=1),
           "trace replay: tokens per Mooncake hash_ids block; equal leading ids give byte-identical prompt prefixes", key="trace_block_tokens"),
    Option("--search", "off", Choice(("off", "concurrency", "rate")),
           "capacity search: --steps (concurrency) or --rates (rate) until --slo fails, then bisect",
           key="search"),
    Option("--slo", "", Checked(check_slo, "is not a valid SLO: {error}"),
           "SLO the capacity search judges each level by, e.g. ttft_p99=0.5,tpot_p50=0.05 (recorded in the manifest)",
           key="slo", always=True),
    Option("--search-precision", 0.05, Fraction(0.05, closed=False),
           "capacity search: stop bisecting when the failing level is within this fraction of the passing one",
           key="search_precision", needs="search"),
    Option("--search-min-requests", 100, Count(minimum=1),
           "capacity search: a level runs until this many requests finished (at most 4x --step-duration)",
           key="search_min_requests", needs="search"),
    Option("--stop-when", "never", Choice(("never", "overloaded")),
           "overloaded: skip the remaining steps after one where the server rejected or timed out requests "
           "(--stop-overload-rate) or its throughput stopped growing while TTFT p50 grew (--stop-ttft-factor)",
           key="stop_when"),
    Option("--stop-ttft-factor", 2.0, Factor(2.0),
           "--stop-when: a step whose throughput is flat stops the staircase when its TTFT p50 is more than "
           "this many times that of the earlier step with the highest throughput",
           key="stop_ttft_factor", needs="stop_when"),
    Option("--stop-min-growth", 0.10, Fraction(0.1, "10% more"),
           "--stop-when: a step's throughput is flat below (1 + this) x the highest of the earlier steps",
           key="stop_min_growth", needs="stop_when"),
    Option("--stop-overload-rate", 0.01, Fraction(0.01, "one in a hundred", closed=False),
           "--stop-when: share of a step's finished requests rejected (429/503) or timed out that stops the staircase",
           key="stop_overload_rate", needs="stop_when"),
    Option("--step-duration", 30.0, Seconds(),
           "seconds each step runs after its users have spawned (includes the warmup)",
           key="step_duration", always=True),
    Option("--step-warmup", 5.0, Seconds(positive=False),
           "seconds at the start of each step kept out of its statistics",
           key="step_warmup", always=True),
    Option("--cold-requests", 3, Count(minimum=0),
           "first requests of the run, at concurrency 1, flagged cold and kept apart (0: none)",
           key="cold_requests", always=True),
    Option("--events-uri", "file://./runs", Checked(check_events_uri, "{error}"),
           "where events go: s3://bucket/prefix, file:///path or a path",
           key="events_uri", in_files="runs", always=True),
    Option("--run-id", "", Checked(parse_run_id),
           "run identifier (default: generated, time-ordered); it names one run: an id already "
           "in the events store is refused"),
    Option("--request-timeout", 600.0, Seconds(), "seconds a whole request may take"),
    Option("--ttft-timeout", 0.0, Seconds(positive=False),
           "seconds to wait for the first token (0: only the request timeout)"),
    Option("--stall-timeout", 60.0, Seconds(positive=False),
           "seconds without a data event after the first token (`: ping` comments do not "
           "count) before a stream counts as stalled"),
    Option("--connect-timeout", 10.0, Seconds(), "seconds to open a connection"),
    Option("--max-event-bytes", 1048576, Count(minimum=1024),
           "bytes one SSE event may hold; a longer one is malformed_event, its connection closed"),
    Option("--tokenizer", "", Kind(),
           "tokenizer directory, tokenizer.json or name: exact prompt lengths, token counts"),
    Option("--seed", 0, Count(), "seed for workload sampling and prompts"),
    Option("--ignore-eos", "auto", _AUTO,
           "send ignore_eos to force output lengths (auto: probe whether the server accepts it)"),
    Option("--continuous-usage", "auto", _AUTO,
           "ask for usage in every event (auto: probe whether the server accepts it)"),
    Option("--cancel-rate", 0.0, Fraction(0.1, "one in ten"),
           "fraction of requests the client cancels on purpose (0-1)"),
    Option("--cancel-after-tokens", 1, Count(minimum=1),
           "output tokens after which a cancelled request disconnects"),
    Option("--response-format", "", Spec(_text(parse_response_format), "json_schema:answer.json",
                                         numbers=False),
           "structured output asked of every request and checked on every answer: json_object "
           "or json_schema:FILE (a JSON Schema); invalid answers are ok rows with output_valid "
           "false", key="response_format"),
    Option("--extra-body", "", Json('{"temperature": 0}', check_extra_body),
           "JSON object merged into every request body (not model, messages, prompt, max_tokens, "
           "max_completion_tokens, stream, stream_options or n: llmload sets those)"),
    Option("--shared-prefix-tokens", 0, Count(minimum=0),
           "tokens of prompt prefix shared by all requests (prefix-cache experiments; "
           "the same as --prefix-groups 1 --prefix-tokens N)"),
    Option("--prefix-groups", 0, Count(minimum=0),
           "shared system prompts: each request starts with one of G seeded prefixes of "
           "--prefix-tokens tokens, picked at random (0: none)", key="prefix_groups"),
    Option("--prefix-tokens", 0, Count(minimum=0),
           "tokens of each --prefix-groups prefix", key="prefix_tokens"),
    Option("--cache-phase", "none", Choice(("none", "flush", "prime", "flush+prime")),
           "before each step: empty the engine's prefix cache (flush: POST /reset_prefix_cache, "
           "else /flush_cache) and/or send each shared prefix once (prime), outside the step", key="cache_phase"),
    Option("--engine-block-size", 16, Count(minimum=1),
           "the engine's prefix-cache block size in tokens: the report's implied cached share "
           "counts whole blocks", key="engine_block_size"),
    Option("--store-prompts", False, Switch(),
           "store prompt text in the events (default: length and SHA-256 only)"),
    Option("--spool-dir", "", Checked(local_folder("--spool-dir")),
           "local spool for event parts (default: system temp)"),
    Option("--finish-timeout", 120.0, Seconds(),
           "seconds the master waits for workers to flush their events at the end"),
    Option("--metadata", "", Json('{"hardware": "1x H100 80GB"}'),
           "JSON object of run facts (hardware, revision, launch_args...) added to the manifest config"),
    Option("--scrape-interval", 2.0, Seconds(positive=False),
           "seconds between scrapes of the target's Prometheus /metrics by the master (0: off)"),
    Option("--otlp-listen", "", Checked(parse_listen, "must be HOST:PORT (port 0-65535), not {value!r}; e.g. otlp_listen: \"0.0.0.0:4318\""),
           "HOST:PORT where the master receives the engine's OTLP/HTTP traces (POST /v1/traces), "
           "stored as the run's spans (empty: off; port 0: any free port)", key="otlp_listen"),
    Option("--otlp-linger", 6.0, Seconds(),
           "seconds without a new span the master keeps receiving after the run (at most 3x this)",
           key="otlp_linger", needs="otlp_listen"),
    Option("--accelerator-metrics", "", Checked(parse_accelerator_source, "{problem}"),
           "accelerator telemetry scraped by the master every --scrape-interval: a DCGM "
           "exporter's Prometheus URL (http://gpu-host:9400/metrics), nvml (this host's GPUs, "
           "through nvidia-ml-py) or target (the target's own /metrics: llmload sim, an engine "
           "sweep's engines); energy, power, utilisation and memory per step (empty: off)",
           key="accelerator_metrics"),
    Option("--accelerators", 0, Count(minimum=0),
           "accelerators serving the target (tensor parallel 2: 2), for tokens/s and cost per "
           "accelerator (0: the GPUs seen in the telemetry)", key="accelerators"),
    Option("--accelerator-hour-price", 0.0, Amount("price of one accelerator-hour"),
           "price of one accelerator-hour, for the cost per 1M output tokens (0: none)",
           key="accelerator_hour_price"),
    Option("--wait-ready", 0.0, Seconds(positive=False),
           "seconds to wait for a target that is still starting (0: it must answer at once, within --connect-timeout)"),
    Option("--gc-freeze", "on", _ON_OFF,
           "freeze start-up objects out of the garbage collector (gc.freeze) so full collections during the run stay short"),
    Option("--report-dir", "", Checked(local_folder("--report-dir")),
           "headless: write the report here at the end of the run; web UI: one folder per run here (default: a temporary folder)"),
)  # fmt: skip

OPTION: Mapping[str, Option] = {option.name: option for option in TABLE}
"""The options by name (the attribute on Locust's parsed options)."""

OPTIONS: list[tuple[str, dict[str, Any]]] = [
    (option.flag, {"env_var": option.env_var, **option.arguments()}) for option in TABLE
]
"""(flag, add_argument keywords) of every option, as Locust's parser gets them."""


def add_arguments(parser: Any) -> None:
    """Register the options on Locust's parser (the init_command_line_parser event)."""
    for flag, kwargs in OPTIONS:
        parser.add_argument(flag, include_in_web_ui=True, **kwargs)


def command_line(settings: Mapping[str, Any]) -> list[str]:
    """The flags that give `settings` (values by option name, as a campaign holds them) to a
    Locust master: empty values left out, the others as Option says."""
    args: list[str] = []
    for option in TABLE:
        value = settings.get(option.name, "")
        if value in ("", ()):
            continue
        if option.needs is not None:
            needed = OPTION[option.needs]
            passed = settings[needed.name] != needed.file_default
        else:
            passed = option.always or value != option.file_default
        if passed:
            args += [option.flag, as_arg(value)]
    return args
