"""Command-line options of `llmload sim` / `python -m infra.simserver` and their mapping
onto SimConfig. Every option can also come from the environment as LLMLOAD_SIM_<NAME>
(e.g. LLMLOAD_SIM_PORT=9000); a flag given on the command line wins."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from analysis.kernel.errors import UsageError
from infra.simserver.config import SimConfig
from infra.simserver.dist import IntDist
from infra.simserver.faults import FaultConfig
from infra.simserver.gpus import GpuConfig
from infra.simserver.prefix_cache import PrefixCacheConfig
from infra.simserver.profiles import PROFILES, EngineProfile, get_profile

ENV_PREFIX = "LLMLOAD_SIM_"


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def _adder(group: Any) -> Any:
    def opt(flag: str, default: Any = None, **kwargs: Any) -> None:
        group.add_argument(flag, default=os.environ.get(env_name(flag), default), **kwargs)

    return opt


def add_arguments(parser: argparse.ArgumentParser) -> None:
    opt = _adder(parser.add_argument_group("server"))
    opt("--host", "127.0.0.1", help="address to bind (default 127.0.0.1)")
    opt("--port", 8000, type=int, help="port; 0 picks a free one (default 8000)")
    opt("--port-file", type=Path, metavar="PATH", help="write the bound port to PATH")
    opt("--model-name", help="served model id (default llmload-sim-<profile>)")
    opt(
        "--served-models",
        "",
        metavar="A,B",
        help="serve several model ids (the first is the default), instead of --model-name",
    )
    opt(
        "--model-cost",
        "",
        metavar="ID:C,...",
        help="a served model's cost: C steps' work per token, prefill and decode (default 1)",
    )
    opt(
        "--adapters",
        "",
        metavar="ID,...",
        help="served ids that are LoRA adapters of the first: each adds --adapter-overhead-ms",
    )
    opt(
        "--adapter-overhead-ms",
        1.0,
        type=float,
        help="extra time of an engine step whose batch holds an adapter's request (default 1)",
    )
    opt("--seed", 0, type=int, help="seed of output text, lengths and faults (default 0)")
    opt("--truth-log", type=Path, metavar="FILE", help="append ground truth (JSON lines)")
    opt(
        "--drain-seconds",
        5.0,
        type=float,
        help="on SIGTERM/SIGINT, time running requests get to finish (default 5)",
    )
    opt(
        "--queue-full-status",
        429,
        type=int,
        choices=(429, 503),
        help="status when the waiting queue is full (default 429)",
    )
    opt(
        "--tokens-per-event",
        "1",
        metavar="K|A-B",
        help="tokens per SSE event: fixed K or uniform A-B (default 1)",
    )
    parser.add_argument("--list-profiles", action="store_true", help="print the profiles and exit")

    opt = _adder(parser.add_argument_group("engine model (override the profile)"))
    opt("--profile", "tiny", help=f"parameter set: {', '.join(PROFILES)} (default tiny)")
    opt(
        "--time-scale",
        1.0,
        type=float,
        help="multiply every engine duration (0.1 = ten times faster; default 1)",
    )
    opt("--max-num-seqs", type=int, help="running sequences at most")
    opt("--kv-cache-tokens", type=int, help="KV budget in tokens")
    opt("--max-model-len", type=int, help="prompt + max_tokens limit")
    opt("--max-num-batched-tokens", type=int, help="prefill tokens + decode seqs per step")
    opt("--max-waiting", type=int, help="waiting-queue capacity")
    opt("--prefill-per-token-us", type=float, help="prefill time per prompt token (µs)")
    opt("--decode-base-ms", type=float, help="decode step time at batch 1 (ms)")
    opt("--decode-per-seq-us", type=float, help="extra decode step time per sequence (µs)")
    opt("--decode-per-kv-token-ns", type=float, help="extra step time per context token (ns)")
    opt("--output-len", metavar="K|A-B", help="sampled output length unless ignore_eos")

    opt = _adder(parser.add_argument_group("prefix cache and tool calls"))
    opt(
        "--prefix-cache",
        "on",
        choices=("on", "off"),
        help="LRU prefix cache of KV blocks shared by all sequences (default on)",
    )
    opt("--block-size", 16, type=int, help="tokens per KV block of the prefix cache (default 16)")
    opt(
        "--prefix-cache-tokens",
        type=int,
        help="prefix cache capacity in tokens (default: the KV budget, --kv-cache-tokens)",
    )
    opt(
        "--tool-call-rate",
        0.5,
        type=float,
        help="share of chat requests with `tools` answered by a tool call (default 0.5)",
    )
    opt(
        "--spec-draft-tokens",
        0,
        type=int,
        help="speculative decoding: tokens drafted per decode step, each accepted with "
        "--spec-acceptance until the first rejection; a step's tokens go in one event "
        "(default 0: off)",
    )
    opt(
        "--spec-acceptance",
        0.7,
        type=float,
        help="speculative decoding: probability each draft token is accepted (default 0.7)",
    )
    opt(
        "--invalid-rate",
        0.0,
        type=float,
        help="share of structured answers (response_format, tool calls) broken on purpose: "
        "JSON that does not parse; the truth log says which (default 0)",
    )

    opt(
        "--reasoning-tokens",
        metavar="K|A-B",
        help="a reasoning phase: the first K (or A..B, drawn per request) output tokens of "
        "each answer that is not a tool call are reasoning, streamed as chat's "
        "reasoning_content, the Responses API's reasoning_text deltas or Messages' thinking; "
        "they count in the output and its cap (default: none)",
    )

    opt = _adder(parser.add_argument_group("simulated GPUs (DCGM-like series on /metrics)"))
    opt("--sim-gpus", 1, type=int,
        help="GPUs serving the engine (tensor parallel), each with DCGM_FI_DEV_* series on "
        "/metrics labelled simulated=\"true\" (default 1; 0: none)")  # fmt: skip
    opt("--gpu-idle-watts", 60.0, type=float, help="a GPU's power while idle (default 60)")
    opt("--gpu-peak-watts", 350.0, type=float,
        help="a GPU's power while the engine runs a step (default 350)")  # fmt: skip

    opt = _adder(parser.add_argument_group("tracing (OpenTelemetry, as vLLM)"))
    opt(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="POST an llm_request span per request, OTLP/HTTP protobuf, to URL "
        "(e.g. http://127.0.0.1:4318/v1/traces; default: no spans)",
    )
    opt(
        "--otlp-service-name",
        "llmload-sim",
        metavar="NAME",
        help="service.name of the spans' resource (default llmload-sim)",
    )

    opt = _adder(parser.add_argument_group("fault injection (rates per request, 0..1)"))
    opt("--fault-500-rate", 0.0, type=float, help="HTTP 500 before streaming")
    opt("--fault-drop-rate", 0.0, type=float, help="connection closed mid-stream")
    opt("--fault-malformed-rate", 0.0, type=float, help="one invalid-JSON event mid-stream")
    opt("--fault-stall-rate", 0.0, type=float, help="stream pauses --stall-seconds mid-stream")
    opt("--stall-seconds", 2.0, type=float, help="length of a stall (default 2)")
    opt("--fault-slow-header-rate", 0.0, type=float, help="headers delayed --slow-header-seconds")
    opt("--slow-header-seconds", 2.0, type=float, help="delay of a slow header (default 2)")


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def profile_from_args(args: argparse.Namespace) -> EngineProfile:
    base = get_profile(args.profile)
    output_len = None
    if args.output_len is not None:
        output_len = IntDist.parse(args.output_len, minimum=1, what="--output-len")
    return base.with_overrides(
        max_num_seqs=args.max_num_seqs,
        kv_cache_tokens=args.kv_cache_tokens,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_waiting=args.max_waiting,
        prefill_per_token=_scaled(args.prefill_per_token_us, 1e-6),
        decode_base=_scaled(args.decode_base_ms, 1e-3),
        decode_per_seq=_scaled(args.decode_per_seq_us, 1e-6),
        decode_per_kv_token=_scaled(args.decode_per_kv_token_ns, 1e-9),
        output_len=output_len,
    )


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in (text or "").split(",") if name.strip())


def _costs(text: str) -> dict[str, float]:
    """--model-cost a:1,b:1.5 (the cost after an id's last colon)."""
    costs: dict[str, float] = {}
    for item in _names(text):
        name, _, cost = item.rpartition(":")
        try:
            costs[name.strip()] = float(cost)
        except ValueError:
            raise UsageError(f"--model-cost {item!r} must be ID:COST, e.g. b:1.5") from None
        if not name.strip():
            raise UsageError(f"--model-cost {item!r} must be ID:COST, e.g. b:1.5")
    return costs


def build_config(args: argparse.Namespace) -> SimConfig:
    """Map parsed options onto a checked SimConfig; raises UsageError."""
    config = SimConfig(
        profile=profile_from_args(args),
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        model_name=args.model_name,
        served_models=_names(args.served_models),
        model_costs=_costs(args.model_cost),
        adapters=_names(args.adapters),
        adapter_overhead_ms=float(args.adapter_overhead_ms),
        seed=args.seed,
        truth_log=args.truth_log,
        drain_seconds=args.drain_seconds,
        queue_full_status=args.queue_full_status,
        tokens_per_event=IntDist.parse(args.tokens_per_event, minimum=1, what="--tokens-per-event"),
        time_scale=args.time_scale,
        prefix_cache=PrefixCacheConfig(
            enabled=args.prefix_cache == "on",
            block_size=args.block_size,
            capacity_tokens=args.prefix_cache_tokens,
        ),
        tool_call_rate=args.tool_call_rate,
        invalid_rate=args.invalid_rate,
        spec_draft_tokens=args.spec_draft_tokens,
        spec_acceptance=args.spec_acceptance,
        gpus=GpuConfig(
            count=int(args.sim_gpus),
            idle_w=float(args.gpu_idle_watts),
            peak_w=float(args.gpu_peak_watts),
        ),
        reasoning_tokens=None
        if args.reasoning_tokens is None
        else IntDist.parse(args.reasoning_tokens, minimum=0, what="--reasoning-tokens"),
        otlp_traces_endpoint=args.otlp_traces_endpoint or None,
        otlp_service_name=args.otlp_service_name,
        faults=FaultConfig(
            error_rate=args.fault_500_rate,
            drop_rate=args.fault_drop_rate,
            malformed_rate=args.fault_malformed_rate,
            stall_rate=args.fault_stall_rate,
            stall_seconds=args.stall_seconds,
            slow_header_rate=args.fault_slow_header_rate,
            slow_header_seconds=args.slow_header_seconds,
        ),
    )
    config.check()
    return config


def profiles_table() -> str:
    rows = [
        "name        max_num_seqs  kv_tokens   max_len  prefill/tok  decode_base  "
        "decode/seq  output_len  description"
    ]
    for p in PROFILES.values():
        rows.append(
            f"{p.name:<11} {p.max_num_seqs:>12}  {p.kv_cache_tokens:>9}  {p.max_model_len:>7}  "
            f"{p.prefill_per_token * 1e6:>9.0f}µs  {p.decode_base * 1e3:>9.1f}ms  "
            f"{p.decode_per_seq * 1e6:>8.0f}µs  {str(p.output_len):>10}  {p.description}"
        )
    return "\n".join(rows)
