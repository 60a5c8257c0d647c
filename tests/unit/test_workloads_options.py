"""Workload specs and option validation: clear errors, reproducible sampling."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.kernel.errors import UsageError
from locustfiles.options.options import OPTIONS, from_parsed
from locustfiles.traffic.workloads import WorkloadKind, parse_workload, workload_kind
from tests.support.options import parsed_options as defaults


def test_mix_weights_and_reproducible_sampling() -> None:
    w = parse_workload("0.7*D(128,64)+0.3*N(2048,512)/(256,64)")
    assert w.scenarios == ["D(128,64)", "N(2048,512)/(256,64)"] and w.weights == pytest.approx(
        [0.7, 0.3]
    )
    a = [w.sampler(1, 0).sample() for _ in range(1)]
    s1, s2, s3 = w.sampler(5, 2), w.sampler(5, 2), w.sampler(5, 3)
    seq1 = [s1.sample() for _ in range(50)]
    assert seq1 == [s2.sample() for _ in range(50)]
    assert seq1 != [s3.sample() for _ in range(50)]
    share = sum(r.scenario == "D(128,64)" for r in seq1 + [s1.sample() for _ in range(950)]) / 1000
    assert 0.65 < share < 0.75 and a


def test_uniform_bounds_included_and_normal_draws_clamped_to_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = parse_workload("U(1,3)/(1,1)").sampler(0)
    drawn = [s.sample() for _ in range(200)]
    assert {r.prompt_tokens for r in drawn} == {1, 2, 3}
    assert {r.max_tokens for r in drawn} == {1}
    assert "clamping" not in caplog.text
    s = parse_workload("N(2,5)/(1,0)").sampler(0)
    assert min(s.sample().prompt_tokens or 0 for _ in range(200)) == 1
    assert "clamping to 1" in caplog.text


def test_dataset_workload(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "hello", "max_tokens": 5}\n\n{"messages": [{"role": "user", "content": "x"}]}\n'
    )
    s = parse_workload(f"dataset:{path}").sampler(0)
    got = {(r.prompt_text, r.max_tokens) for r in (s.sample() for _ in range(30))}
    assert got == {("hello", 5), (None, None)}
    path.write_text('{"prompt": 3}\n')
    with pytest.raises(UsageError, match=r"p.jsonl:1: each line needs"):
        parse_workload(f"dataset:{path}")


def test_a_workload_carries_its_kind(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello", "max_tokens": 5}\n')
    dataset = parse_workload(f" dataset:{path}")
    lengths = parse_workload("0.5*D(8,4)+0.5*U(1,9)/(2,3)")
    assert (dataset.kind, lengths.kind) == (WorkloadKind.DATASET, WorkloadKind.LENGTHS)
    assert dataset.trace is None and lengths.trace is None
    assert workload_kind("conversations:/nope.jsonl") is WorkloadKind.CONVERSATIONS  # no load
    assert workload_kind("trace:x") is WorkloadKind.TRACE
    assert workload_kind("D(8,4)") is workload_kind("datasets:x") is WorkloadKind.LENGTHS


@pytest.mark.parametrize(
    ("spec", "message"),
    [("X(1,2)", "not understood"), ("U(5,1)/(1,2)", "min <= max"), ("N(5,-1)/(1,1)", "sd >= 0"),
     ("0*D(1,2)", "weight must be positive"), ("dataset:/nope.jsonl", "does not exist"),
     ("D(-5,10)", r"workload D\(-5,10\): the prompt length must be >= 1 token, not -5; e\.g\."),
     ("D(128,0)", "the output length must be >= 1 token, not 0"),
     ("D(0.4,8)", "the prompt length must be >= 1 token, not 0.4"),
     ("N(0,5)/(10,2)", "the prompt mean of N"), ("N(10,2)/(-3,1)", "the output mean of N"),
     ("U(0,10)/(5,9)", "the prompt min of U"), ("U(1,10)/(-5,9)", "the output min of U"),
     ("D(8,4)+-1*D(2,2)", r"workload D\(2,2\): weight must be positive, not -1"),
     ("dataset:", "no path given"), ("dataset:/", "is not a file")],
)  # fmt: skip
def test_bad_workloads_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_workload(spec)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "has no prompts"), ("\n\n", "has no prompts"), ('{"prompt": "a"}\n{bad\n', ":2: not valid JSON"),
     ('{"prompt": ""}\n', 'non-empty "prompt"'), ('{"messages": []}\n', 'non-empty "prompt"'),
     ('["a"]\n', ":1: each line needs"), ('{"prompt": "a", "max_tokens": 0}\n', "max_tokens must be an integer >= 1"),
     ('{"prompt": "a", "prompt_tokens": true}\n', "prompt_tokens must be an integer >= 1, not True"),
     ('{"prompt": "a", "max_tokens": 2.5}\n', "max_tokens must be an integer >= 1"),
     ('{"prompt": "a"}\n{"prompt": "b", "max_tokens": 1000000000000}\n',
      r":2: max_tokens 1000000000000 is above 2147483647, the most a request row records"),
     ('{"prompt": "a", "prompt_tokens": 2147483648}\n', r"\(prompt_tokens_requested\)")],
)  # fmt: skip
def test_bad_datasets_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        parse_workload(f"dataset:{path}")


def test_dataset_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(UsageError, match="is not UTF-8 text"):
        parse_workload(f"dataset:{path}")


def test_defaults_are_valid_and_every_option_has_an_env_var() -> None:
    opts = from_parsed(defaults())
    assert opts.steps == (1, 2, 4, 8) and opts.stream
    assert all(
        kw["env_var"] == "LOCUST_" + f.lstrip("-").replace("-", "_").upper() for f, kw in OPTIONS
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"steps": "1,x"}, "--steps"), ({"steps": "0"}, ">= 1"), ({"extra_body": "[1]"}, "JSON object"),
     ({"extra_body": "{"}, "not valid JSON"), ({"cancel_rate": 1.5}, "between 0 and 1"),
     ({"step_warmup": 40.0}, "shorter than --step-duration"), ({"events_uri": "ftp://x"}, "not supported"),
     ({"request_timeout": 0.0}, "must be > 0"), ({"api_key_env": "A B"}, "environment variable name"),
     ({"step_duration": 0.0}, "--step-duration must be > 0 seconds, not 0.0"),
     ({"step_duration": -5.0}, "--step-duration must be > 0 seconds"),
     ({"step_duration": float("nan")}, "--step-duration must be > 0 seconds, not nan"),
     ({"step_warmup": -1.0}, "--step-warmup must be >= 0 seconds"),
     ({"connect_timeout": float("inf")}, "--connect-timeout must be > 0 seconds, not inf"),
     ({"finish_timeout": 0.0}, "--finish-timeout must be > 0"),
     ({"ttft_timeout": -1.0}, "--ttft-timeout must be >= 0"), ({"stall_timeout": -1.0}, "--stall-timeout"),
     ({"scrape_interval": -2.0}, "--scrape-interval must be >= 0"), ({"wait_ready": -1.0}, "--wait-ready"),
     ({"cancel_rate": -0.1}, "--cancel-rate must be between 0 and 1"),
     ({"cancel_rate": float("nan")}, "--cancel-rate must be between 0 and 1"),
     ({"cold_requests": -1}, "--cold-requests must be an integer >= 0, not -1"),
     ({"shared_prefix_tokens": -1}, "--shared-prefix-tokens must be an integer >= 0"),
     ({"cancel_after_tokens": 0}, "--cancel-after-tokens must be an integer >= 1, not 0"),
     ({"run_id": "../x"}, "--run-id '../x' must be letters"), ({"run_id": "a/b"}, "--run-id"),
     ({"run_id": "a\n"}, "--run-id")],
)  # fmt: skip
def test_invalid_options_are_one_clear_error(changes: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        from_parsed(defaults(**changes))


def test_options_are_documented_in_the_readme() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    missing = [flag for flag, _ in OPTIONS if f"`{flag}" not in readme]
    assert missing == []
