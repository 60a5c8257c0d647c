"""Trace replay: reading the three formats, the window and speedup, the shared schedule, the
options a trace sets or refuses, and prompts whose prefix blocks are byte-identical."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from analysis.kernel.errors import UsageError
from locustfiles.options.options import from_parsed
from locustfiles.request.tokenizer import load_tokenizer
from locustfiles.traffic.prompts import PromptBuilder
from locustfiles.traffic.trace import TraceSettings, detect_format, load_trace, read_trace
from tests.support.options import parsed_options
from tests.unit.test_prompts import BUILDERS, EXACT

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"


@pytest.mark.parametrize(
    ("name", "fmt", "rows"),
    [("mooncake.jsonl", "mooncake", 1000), ("azure.csv", "azure", 200),
     ("burstgpt.csv", "burstgpt", 200)],
)  # fmt: skip
def test_the_bundled_examples_are_read_in_their_detected_format(
    name: str, fmt: str, rows: int
) -> None:
    path = TRACES / name
    assert detect_format(path) == fmt
    read = read_trace(path, fmt)
    assert read[0].at_s == 0 and all(a.at_s <= b.at_s for a, b in zip(read, read[1:], strict=False))
    skipped = rows - len(read)  # BurstGPT's failed requests (0 response tokens)
    assert skipped == 0 if fmt != "burstgpt" else 0 < skipped < 10
    assert all(r.input_length >= 1 and r.output_length >= 1 for r in read)
    assert all(r.hash_ids for r in read) == (fmt == "mooncake")


def test_the_example_script_writes_the_bundled_files(tmp_path: Path) -> None:
    import runpy

    runpy.run_path(str(TRACES.parent / "make_traces.py"), run_name="make")["main"](tmp_path)
    for name in ("mooncake.jsonl", "azure.csv", "burstgpt.csv"):
        assert (tmp_path / name).read_bytes() == (TRACES / name).read_bytes(), name


def _mooncake(tmp: Path, rows: list[dict[str, object]]) -> Path:
    path = tmp / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_window_and_speedup_give_each_arrival_its_time(tmp_path: Path) -> None:
    rows = [{"timestamp": 1000 + 500 * i, "input_length": 10, "output_length": 2,
             "hash_ids": [i]} for i in range(10)]  # fmt: skip
    path = _mooncake(tmp_path, list(reversed(rows)))  # order by time, not by line
    whole = load_trace(path, TraceSettings(speedup=2.0))
    assert whole.offsets_s == pytest.approx([0.25 * i for i in range(10)])
    assert whole.rate == pytest.approx(10 / 2.25)
    cut = load_trace(path, TraceSettings(start_s=1.0, duration_s=2.0, speedup=4.0))
    assert [r.hash_ids for r in cut.rows] == [(2,), (3,), (4,), (5,)]
    assert cut.offsets_s == pytest.approx([0.0, 0.125, 0.25, 0.375]) and cut.span_s == 0.5
    shares = [list(cut.share(p, 3)) for p in range(3)]
    assert sorted(i for share in shares for i, _ in share) == [0, 1, 2, 3]
    assert all(i % 3 == p for p, share in enumerate(shares) for i, _ in share)


@pytest.mark.parametrize(
    ("line", "problem"),
    [('{"timestamp": 1, "input_length": 0, "output_length": 2}', "input_length must be"),
     ('{"timestamp": 1, "output_length": 2}', 'no "input_length"'),
     ('{"timestamp": "x", "input_length": 3, "output_length": 2}', "timestamp must be"),
     ('{"timestamp": 1, "input_length": 3, "output_length": 2, "hash_ids": "a"}', "hash_ids"),
     ("{not json", "not valid JSON")],
)  # fmt: skip
def test_a_bad_mooncake_line_is_named(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 3, "output_length": 2}\n' + line + "\n")
    with pytest.raises(UsageError, match=f"t.jsonl:2: .*{problem}"):
        load_trace(path, TraceSettings())


def test_bad_csv_traces_are_named(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,5,x\n")
    with pytest.raises(UsageError, match="t.csv:2: GeneratedTokens must be an integer"):
        load_trace(path, TraceSettings())
    path.write_text("when,what\n1,2\n")
    with pytest.raises(UsageError, match="not recognised .* --trace-format"):
        load_trace(path, TraceSettings())
    with pytest.raises(UsageError, match="no column 'Timestamp'"):
        load_trace(path, TraceSettings(format="burstgpt"))


def test_a_trace_makes_the_run_one_rate_step() -> None:
    trace = f"trace:{TRACES / 'azure.csv'}"
    options = from_parsed(parsed_options(workload=trace, trace_speedup="10"))
    replay = options.workload.trace.replay
    assert options.mode == "rate" and options.arrival == "trace"
    assert options.rates == (pytest.approx(replay.rate),) and options.step_warmup == 0
    assert options.step_duration == pytest.approx(replay.span_s + 5.0)
    spec = options.workload.trace.spec(3)
    assert (spec.prompt_tokens, spec.max_tokens) == (
        replay.rows[3].input_length, replay.rows[3].output_length)  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "problem"),
    [({"rates": "1,2"}, "--rates cannot be given with --workload trace"),
     ({"search": "rate"}, "--search cannot be given"),
     ({"turns": "3"}, "--turns cannot be given"),
     ({"trace_speedup": "-1"}, "--trace-speedup must be a number > 0"),
     ({"trace_start": 1e9}, "no request in the window")],
)  # fmt: skip
def test_options_a_trace_refuses(changes: dict[str, object], problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        from_parsed(parsed_options(workload=f"trace:{TRACES / 'mooncake.jsonl'}", **changes))


def test_trace_options_need_a_trace() -> None:
    with pytest.raises(UsageError, match="--trace-start applies to a trace"):
        from_parsed(parsed_options(trace_start=3.0))


def _shared_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_prompts_with_the_same_leading_blocks_share_a_byte_identical_prefix() -> None:
    builder = PromptBuilder(0)
    one = builder.build_blocks(1100, random.Random(1), (5, 6, 7), 512)
    two = builder.build_blocks(2000, random.Random(2), (5, 6, 8), 512)
    cut = builder.build_blocks(300, random.Random(3), (5, 6), 512)
    assert [len(t.split()) for t in (one, two, cut)] == [1100, 2000, 300]
    assert len(one[: _shared_prefix(one, two)].split()) == 1024  # blocks 5 and 6, whole
    assert one.startswith(cut)  # a prompt shorter than its blocks is their start
    other = builder.build_blocks(1100, random.Random(1), (9, 6, 7), 512)
    assert len(one[: _shared_prefix(one, other)].split()) == 1  # the anchor alone
    assert PromptBuilder(0).build_blocks(1100, random.Random(4), (5, 6, 7), 512)[:100] == one[:100]


@pytest.mark.parametrize("name", EXACT)
def test_block_prompts_are_exact_for_a_tokenizer(name: str, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    BUILDERS[name]().save(str(path))  # type: ignore[attr-defined]
    counter = load_tokenizer(str(path))
    builder = PromptBuilder(7, counter)
    rng = random.Random(0)
    texts = [builder.build_blocks(n, rng, ids, 64) for n, ids in
             ((200, (1, 2, 3, 4)), (150, (1, 2, 9)), (100, (1, 2)), (50, ()))]  # fmt: skip
    assert counter.counts(texts) == [200, 150, 100, 50]
    prefix = counter.count(texts[0][: _shared_prefix(texts[0], texts[1])])
    assert prefix >= 128  # blocks 1 and 2 (a piece may join the next, never fewer)
