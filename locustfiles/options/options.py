"""The chat user's options: registered on Locust's parser, validated once into ChatOptions.

Every option is declared once, in table.py (flag, campaign key, kind, default, help); checks
between options are rules.py's. Every option is also settable as `LOCUST_<NAME>` (e.g.
`LOCUST_WORKLOAD`) and in a Locust config file (`--config FILE`, `workload = D(128,64)`).
Invalid values stop the run before any request with one line naming the option and the fix,
exit status 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from analysis.kernel.errors import UsageError
from locustfiles.options.rules import check_together
from locustfiles.options.table import OPTION, OPTIONS, TABLE, add_arguments
from locustfiles.options.tracerun import apply_trace
from locustfiles.request.validity import ResponseFormat
from locustfiles.traffic.models import ModelMix, parse_model_mix
from locustfiles.traffic.spread import Spread
from locustfiles.traffic.workloads import Workload, WorkloadKind

__all__ = ["OPTIONS", "ChatOptions", "add_arguments", "from_parsed", "parse_metadata"]


ENDPOINT_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
"""Each --endpoint's path on the target."""


@dataclass(frozen=True)
class ChatOptions:
    """The options of one run, checked; each field is the option of the same name (table.py),
    except `stream` (not --no-stream) and `gc_freeze` (--gc-freeze on)."""

    model: str
    api_key_env: str
    endpoint: str
    stream: bool
    workload: Workload
    steps: tuple[int, ...]
    step_duration: float
    step_warmup: float
    cold_requests: int
    events_uri: str
    run_id: str
    request_timeout: float
    ttft_timeout: float | None  # None: off
    stall_timeout: float | None  # None: off
    connect_timeout: float
    max_event_bytes: int
    tokenizer: str
    seed: int
    ignore_eos: str
    continuous_usage: str
    cancel_rate: float
    cancel_after_tokens: int
    extra_body: dict[str, Any]
    response_format: ResponseFormat | None
    shared_prefix_tokens: int
    prefix_groups: int  # --shared-prefix-tokens N is one group of N tokens (from_parsed)
    prefix_tokens: int
    cache_phase: str
    engine_block_size: int
    store_prompts: bool
    spool_dir: str
    finish_timeout: float
    metadata: dict[str, Any]
    scrape_interval: float
    otlp_listen: str
    otlp_linger: float
    accelerator_metrics: str  # "" (off), "nvml" or a DCGM exporter's URL
    accelerators: int  # 0: the GPUs the telemetry shows
    accelerator_hour_price: float  # 0: none
    gc_freeze: bool
    wait_ready: float
    report_dir: str
    rates: tuple[float, ...]
    arrival: str
    max_concurrency: int
    over_cap: str
    search: str
    slo: str
    search_precision: float
    search_min_requests: int
    stop_when: str  # never | overloaded (locustfiles/master/overload.py)
    stop_ttft_factor: float
    stop_min_growth: float
    stop_overload_rate: float
    turns: Spread
    think_time: Spread
    history: int  # 0: full; N: the last N turns
    followup_workload: Workload | None
    tool_rate: float
    tool_latency: Spread
    trace_format: str  # auto | mooncake | azure | burstgpt (options/tracerun.py)
    trace_speedup: float
    trace_start: float
    trace_duration: float
    trace_block_tokens: int

    @property
    def sessions(self) -> bool:
        """Multi-turn sessions (or agent tool rounds) instead of single requests."""
        return (
            self.turns.spec != "1"
            or self.tool_rate > 0
            or self.workload.kind is WorkloadKind.CONVERSATIONS
        )

    @property
    def model_mix(self) -> ModelMix:
        """--model parsed: one model, a weighted mix, or none (the server's first)."""
        return parse_model_mix(self.model)

    @property
    def mode(self) -> str:
        """ "rate" (open loop: --rates) or "concurrency" (closed loop: --steps)."""
        return "rate" if self.rates else "concurrency"

    @property
    def levels(self) -> tuple[float, ...]:
        """The steps' levels: rates (requests/s) or concurrencies."""
        return self.rates if self.rates else tuple(float(s) for s in self.steps)

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    def config(self) -> dict[str, Any]:
        """What the manifest records (no secret values: the key is named, not given)."""
        skip = ("workload", "metadata", "followup_workload", "turns", "think_time", "tool_latency",
                "response_format")  # fmt: skip
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in skip}
        out["workload"] = self.workload.spec
        out["followup_workload"] = self.followup_workload.spec if self.followup_workload else ""
        out.update(turns=self.turns.spec, think_time=self.think_time.spec,
                   tool_latency=self.tool_latency.spec)  # fmt: skip
        out["response_format"] = self.response_format.spec if self.response_format else ""
        out["history"] = "full" if not self.history else f"window:{self.history}"
        out["trace_speedup"] = f"{self.trace_speedup:g}"  # as written: a Spec's text
        out.update(self.metadata)  # top level: the report reads e.g. config.hardware
        return out


def parse_metadata(text: str) -> dict[str, Any]:
    """--metadata: a JSON object whose keys must not shadow an option in the manifest config."""
    option = OPTION["metadata"]
    return _unshadowed(option.kind.value(text, option.cli()))


def _unshadowed(metadata: dict[str, Any]) -> dict[str, Any]:
    taken = sorted(set(metadata) & set(ChatOptions.__dataclass_fields__))
    if taken:
        raise UsageError(f"--metadata key {taken[0]!r} is an option's name; rename the key")
    return metadata


def from_parsed(ns: Any) -> ChatOptions:
    """Validate Locust's parsed options into ChatOptions; UsageError names the problem."""
    values = {
        option.name: option.kind.value(getattr(ns, option.name, option.default), option.cli())
        for option in TABLE
    }

    def given(name: str) -> bool:
        return bool(values[name] != OPTION[name].default_setting)

    apply_trace(values, given)  # a trace workload sets the rate step (options/tracerun.py)
    check_together(values, given, lambda name: OPTION[name].cli())
    values.update(
        stream=not values.pop("no_stream"),
        gc_freeze=values["gc_freeze"] == "on",
        ttft_timeout=values["ttft_timeout"] or None,
        stall_timeout=values["stall_timeout"] or None,
        metadata=_unshadowed(values["metadata"]),
    )
    if values["response_format"] is not None and values["ignore_eos"] == "auto":
        values["ignore_eos"] = "off"  # the format's grammar ends each answer: no forced length
    if values["shared_prefix_tokens"]:  # one prefix shared by all: one group
        values.update(prefix_groups=1, prefix_tokens=values["shared_prefix_tokens"])
    return ChatOptions(**values)
