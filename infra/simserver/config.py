"""The simulator's configuration, parsed once at the entry point and passed down."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from analysis.kernel.errors import UsageError
from infra.simserver.dist import IntDist
from infra.simserver.faults import FaultConfig
from infra.simserver.gpus import GpuConfig
from infra.simserver.prefix_cache import PrefixCacheConfig
from infra.simserver.profiles import PROFILES, EngineProfile
from infra.simserver.tracing import DEFAULT_SERVICE_NAME, Endpoint


@dataclass(frozen=True)
class SimConfig:
    profile: EngineProfile = field(default_factory=lambda: PROFILES["tiny"])
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None  # default: llmload-sim-<profile>
    seed: int = 0
    tokens_per_event: IntDist = IntDist(1, 1)
    time_scale: float = 1.0  # multiplies every engine duration (0.1 = ten times faster)
    queue_full_status: int = 429
    faults: FaultConfig = field(default_factory=FaultConfig)
    truth_log: Path | None = None
    port_file: Path | None = None
    drain_seconds: float = 5.0  # on SIGTERM/SIGINT: let running requests finish this long
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    tool_call_rate: float = 0.5  # share of chat requests with `tools` answered by a tool call
    # a reasoning phase: the first N output tokens of each answer (not a tool call) are
    # reasoning, drawn per request; None: none
    reasoning_tokens: IntDist | None = None
    # structured answers and tool calls broken on purpose (infra/simserver/structured.py)
    invalid_rate: float = 0.0
    # speculative decoding (infra/simserver/engine.py Speculation): draft tokens per step
    # (0: off) and the probability each is accepted
    spec_draft_tokens: int = 0
    spec_acceptance: float = 0.7
    gpus: GpuConfig = field(default_factory=GpuConfig)  # the simulated GPUs' telemetry
    otlp_traces_endpoint: str | None = None  # OTLP/HTTP URL; None: no spans
    otlp_service_name: str = DEFAULT_SERVICE_NAME
    # several models (--served-models a,b): every id served, the first the default
    served_models: tuple[str, ...] = ()
    model_costs: Mapping[str, float] = field(default_factory=dict)  # id -> steps per token
    adapters: tuple[str, ...] = ()  # ids that are LoRA adapters of the first base model
    adapter_overhead_ms: float = 1.0  # a step holding an adapter's sequence lasts this longer

    @property
    def served_model(self) -> str:
        """The default model (the first served): /version's, the metrics' label."""
        if self.served_models:
            return self.served_models[0]
        return self.model_name or f"llmload-sim-{self.profile.name}"

    @property
    def models(self) -> tuple[str, ...]:
        """Every model id served."""
        return self.served_models or (self.served_model,)

    def model_cost(self, model: str) -> tuple[float, float]:
        """A model's (cost, step overhead in seconds), see engine.py."""
        overhead = self.adapter_overhead_ms / 1000 if model in self.adapters else 0.0
        return self.model_costs.get(model, 1.0), overhead

    @property
    def prefix_cache_tokens(self) -> int:
        """The prefix cache's capacity: `--prefix-cache-tokens`, else the KV budget."""
        tokens = self.prefix_cache.capacity_tokens
        return self.profile.kv_cache_tokens if tokens is None else tokens

    def check(self) -> None:
        """Refuse values that cannot be right, naming the option (`llmload sim` flags)."""
        self.profile.check()
        self.faults.check()
        self.prefix_cache.check()
        if not 0.0 <= self.tool_call_rate <= 1.0:
            raise UsageError(
                f"--tool-call-rate must be in [0, 1] (0.5: every other request with tools), "
                f"not {self.tool_call_rate}"
            )
        if self.spec_draft_tokens < 0 or not 0.0 <= self.spec_acceptance <= 1.0:
            raise UsageError(
                f"--spec-draft-tokens must be >= 0 (0: off) and --spec-acceptance in [0, 1], "
                f"not {self.spec_draft_tokens} and {self.spec_acceptance}"
            )
        g = self.gpus
        if g.count < 0 or not (0 <= g.idle_w <= g.peak_w and math.isfinite(g.peak_w)):
            raise UsageError(
                f"--sim-gpus must be >= 0 (0: none) and 0 <= --gpu-idle-watts <= "
                f"--gpu-peak-watts, not {g.count}, {g.idle_w} and {g.peak_w}"
            )
        if not 0.0 <= self.invalid_rate <= 1.0:
            raise UsageError(
                f"--invalid-rate must be in [0, 1] (0.1: one structured answer in ten broken), "
                f"not {self.invalid_rate}"
            )
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port must be in 0..65535 (0: any free port), not {self.port}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise UsageError(
                f"--time-scale must be > 0 (0.1: ten times faster), not {self.time_scale}"
            )
        if self.queue_full_status not in (429, 503):
            raise UsageError(
                f"--queue-full-status must be 429 or 503, not {self.queue_full_status}"
            )
        if not (math.isfinite(self.drain_seconds) and self.drain_seconds >= 0):
            raise UsageError(f"--drain-seconds must be >= 0 seconds, not {self.drain_seconds}")
        if self.otlp_traces_endpoint is not None:
            Endpoint.parse(self.otlp_traces_endpoint)
        if not self.otlp_service_name.strip():
            raise UsageError("--otlp-service-name must not be empty")
        if self.model_name is not None and not self.model_name.strip():
            raise UsageError("--model-name must not be empty; leave it out for the default")
        self._check_models()
        for flag, path in (("--truth-log", self.truth_log), ("--port-file", self.port_file)):
            if path is not None and not Path(path).parent.is_dir():
                raise UsageError(
                    f"{flag} {path}: folder {Path(path).parent} does not exist; "
                    "give a file in an existing, writable folder"
                )
            if path is not None and Path(path).is_dir():
                raise UsageError(f"{flag} {path} is a folder; give a file name")

    def _check_models(self) -> None:
        if self.served_models and self.model_name is not None:
            raise UsageError("give --served-models or --model-name, not both "
                             "(--served-models a,b serves a and b; a is the default)")  # fmt: skip
        if len(set(self.served_models)) != len(self.served_models) or any(
            not m.strip() for m in self.served_models
        ):
            raise UsageError(f"--served-models must name distinct ids, not {self.served_models}")
        for flag, names in (
            ("--model-cost", list(self.model_costs)),
            ("--adapters", self.adapters),
        ):
            for name in names:
                if name not in self.models:
                    raise UsageError(
                        f"{flag} names {name!r}, which is not served; serve it with "
                        f"--served-models {','.join((*self.models, name))}"
                    )
        for name, cost in self.model_costs.items():
            if not (math.isfinite(cost) and cost > 0):
                raise UsageError(f"--model-cost {name}:{cost} must be > 0 (1.5: 50% slower)")
        if self.models[0] in self.adapters:
            raise UsageError("--adapters: the first of --served-models is the base model, "
                             "not an adapter; list the base model first")  # fmt: skip
        if not (math.isfinite(self.adapter_overhead_ms) and self.adapter_overhead_ms >= 0):
            raise UsageError(f"--adapter-overhead-ms must be >= 0, not {self.adapter_overhead_ms}")
