"""The Prometheus text parser and the engine gauges read from it (analysis/kernel/prometheus.py)."""

from __future__ import annotations

import math

import pytest

from analysis.kernel.prometheus import (
    PrometheusFormatError,
    Sample,
    allowed,
    engine_gauges,
    parse_prometheus,
)

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 7.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 1.5e1 1700000000000
process_cpu_seconds_total 12.5
"""


def test_parses_names_labels_values_and_skips_comments() -> None:
    samples = parse_prometheus(VLLM)
    assert len(samples) == 10
    first = samples[0]
    assert first == Sample("vllm:num_requests_running", (("engine", "0"), ("model_name", "m")), 3.0)
    assert first.key == 'vllm:num_requests_running{engine="0",model_name="m"}'
    bucket = samples[7]
    assert dict(bucket.labels)["le"] == "+Inf" and bucket.value == 7.0
    assert samples[8].value == 15.0  # exponent; the trailing timestamp is ignored
    assert samples[9] == Sample("process_cpu_seconds_total", (), 12.5)


def test_label_escapes_special_values_and_blank_lines() -> None:
    text = 'm{a="x\\"y",b="1\\\\2",c="l\\nm",} NaN\n\n  n +Inf\no -Inf\np{} 4\n'
    m, n, o, p = parse_prometheus(text)
    assert dict(m.labels) == {"a": 'x"y', "b": "1\\2", "c": "l\nm"} and math.isnan(m.value)
    assert n.value == math.inf and o.value == -math.inf and p == Sample("p", (), 4.0)


@pytest.mark.parametrize(
    "text",
    ["<html><body>Not Found</body></html>", '{"detail": "Not Found"}', "m{a=x} 1", "m one"],
)
def test_text_that_is_not_prometheus_is_refused(text: str) -> None:
    with pytest.raises(PrometheusFormatError):
        parse_prometheus(text)


def test_engine_gauges_sum_label_sets_and_keep_the_fullest_cache() -> None:
    gauges = engine_gauges(parse_prometheus(VLLM))
    assert (gauges.running, gauges.waiting, gauges.kv_cache_usage) == (5.0, 1.0, 0.5)
    assert dict(gauges.sources) == {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv_cache_usage": "vllm:kv_cache_usage_perc",  # the newer name wins over gpu_cache
    }


def test_simulator_names_and_missing_gauges() -> None:
    sim = "llmload_sim_requests_running 2\nllmload_sim_kv_cache_usage_ratio 0.125\n"
    gauges = engine_gauges(parse_prometheus(sim))
    assert gauges.running == 2 and gauges.kv_cache_usage == 0.125
    assert gauges.waiting is None and not gauges.empty  # missing, never 0
    assert engine_gauges(parse_prometheus("process_cpu_seconds_total 1\n")).empty
    custom = engine_gauges(parse_prometheus("my_running 7\n"), running_names=("my_running",))
    assert custom.running == 7


def test_allowlist_matches_names_and_prefixes() -> None:
    allow = ("vllm:prompt_tokens_total", "sglang:*")
    assert allowed("vllm:prompt_tokens_total", allow)
    assert allowed("sglang:num_queue_reqs", allow)
    assert not allowed("vllm:prompt_tokens", allow)


# what prometheus_client itself writes (vLLM, SGLang), and a Rust exporter's bare counter (TGI)
TYPED = """\
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 3.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 1.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 120.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{model_name="m"} 1.7e9
# TYPE tgi_request_count counter
tgi_request_count 5
# TYPE tgi_queue_size gauge
tgi_queue_size 2
"""


def test_every_sample_keeps_the_name_the_server_wrote() -> None:
    samples = parse_prometheus(TYPED)
    assert [s.name for s in samples] == [
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:prompt_tokens_total",
        "vllm:prompt_tokens_created",
        "tgi_request_count",  # not renamed to tgi_request_count_total
        "tgi_queue_size",
    ]
    assert samples[1].key == 'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"}'
    assert all(type(s.value) is float for s in samples)  # `5` is read as 5.0
    assert engine_gauges(samples).waiting == 2.0


def test_a_refusal_names_the_line() -> None:
    with pytest.raises(PrometheusFormatError, match=r"line 2 '<html>'"):
        parse_prometheus("ok_metric 1\n<html>\n")
