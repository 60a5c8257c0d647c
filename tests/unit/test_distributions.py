"""One grammar for a number that may vary (analysis/kernel/distribution.py) and its
three users: spreads (sessions), workload lengths and the simulator's K|A-B options."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.kernel.distribution import (
    SPELLINGS,
    BadDistribution,
    Distribution,
    parse_distribution,
)
from analysis.kernel.errors import UsageError
from infra.simserver.dist import IntDist
from locustfiles.traffic.spread import parse_spread
from locustfiles.traffic.workloads import parse_workload

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "integer", "kind", "a", "b"),
    [("2", False, "fixed", 2, 0), (".5", False, "fixed", 0.5, 0), ("128", True, "fixed", 128, 0),
     ("16-128", True, "uniform", 16, 128), (" 1 - 4 ", True, "uniform", 1, 4),
     ("U(2,5)", True, "uniform", 2, 5), ("u( 0.2 , 1 )", False, "uniform", 0.2, 1),
     ("N(2048,512)", True, "normal", 2048, 512), ("N(2,0.5)", False, "normal", 2, 0.5),
     ("exp(2)", False, "exp", 2, 0), ("EXP(0)", False, "exp", 0, 0)],
)  # fmt: skip
def test_every_spelling_parses_to_one_type(
    text: str, integer: bool, kind: str, a: float, b: float
) -> None:
    dist = parse_distribution(text, integer=integer)
    assert (dist.kind, dist.a, dist.b, dist.integer) == (kind, a, b, integer)
    assert str(dist) == text.strip()


def test_the_same_distribution_whoever_parses_it() -> None:
    """A-B and U(a,b) are one distribution; each user's spec gives the grammar's type."""
    sim = IntDist.parse("16-128")
    assert isinstance(sim, Distribution)
    assert sim == parse_distribution("U(16,128)", integer=True)
    assert parse_spread("--turns", "U(2,5)", integer=True) == parse_distribution(
        "2-5", integer=True, minimum=1
    )
    assert IntDist.parse("3") == IntDist(3, 3) == parse_distribution("3", integer=True)
    lengths = parse_workload("U(64,256)/(16,128)").components[0]
    assert lengths.prompt == parse_distribution("U(64,256)", integer=True, minimum=1)
    assert lengths.output == parse_distribution("16-128", integer=True, minimum=1)
    fixed = parse_workload("D(128,64)").components[0]
    assert (fixed.prompt.low, fixed.output.low) == (128, 64)
    assert str(IntDist(16, 128)) == "16-128" and str(IntDist(4, 4)) == "4"


def test_sampling_is_seeded_and_makes_the_stdlib_draws() -> None:
    """The same rng calls as before the grammar was shared: seeds keep their sequences."""

    def draws(text: str, integer: bool = False, minimum: float = 0) -> list[float]:
        dist, rng = parse_distribution(text, integer=integer, minimum=minimum), random.Random(9)
        return [dist.sample(rng) for _ in range(50)]

    ref = random.Random(9)
    assert draws("1-6", integer=True) == [ref.randint(1, 6) for _ in range(50)]
    ref = random.Random(9)
    assert draws("U(0.5,2)") == [ref.uniform(0.5, 2) for _ in range(50)]
    ref = random.Random(9)
    assert draws("exp(2)") == [ref.expovariate(0.5) for _ in range(50)]
    ref = random.Random(9)
    assert draws("N(3,4)", integer=True, minimum=1) == [
        max(1, round(ref.gauss(3, 4))) for _ in range(50)
    ]
    assert draws("7") == [7.0] * 50 and draws("exp(0)") == [0.0] * 50
    assert draws("N(2,1)") == draws("N(2,1)")


def test_integer_draws_are_whole_and_clamped_unless_asked_not_to() -> None:
    dist = parse_distribution("N(1,5)", integer=True, minimum=1)
    rng = random.Random(2)
    clamped = [dist.sample(rng) for _ in range(500)]
    assert all(isinstance(v, int) and v >= 1 for v in clamped)
    raw = [dist.sample(rng, False) for _ in range(500)]
    assert min(raw) < 1 and all(isinstance(v, int) for v in raw)
    assert (dist.low, dist.high) == (1, float("inf"))
    uniform = parse_distribution("U(1.5,3.9)", integer=True, whole=False, minimum=1)
    assert (uniform.low, uniform.high) == (1, 3)  # fractional bounds truncate
    assert parse_distribution("1.5", integer=True, whole=False).low == 2  # a fraction rounds


@pytest.mark.parametrize(
    ("text", "options", "rule", "kind"),
    [("soon", {}, "syntax", None), ("", {}, "syntax", None), ("inf", {}, "syntax", None),
     ("exp(2)", {"spellings": ("K", "U")}, "syntax", None), ("1-3", {"spellings": ("K",)}, "syntax", None),
     ("1.5", {"integer": True}, "whole", "fixed"), ("U(1,2.5)", {"integer": True}, "whole", "uniform"),
     ("0", {"minimum": 1}, "min", "fixed"), ("-1", {}, "min", "fixed"), ("U(0,3)", {"minimum": 1}, "min", "uniform"),
     ("5-2", {}, "order", "uniform"), ("N(-1,1)", {}, "min", "normal"), ("N(1,-1)", {}, "sd", "normal"),
     ("exp(-2)", {}, "min", "exp")],
)  # fmt: skip
def test_refusals_name_the_rule(text: str, options: dict, rule: str, kind: str | None) -> None:
    with pytest.raises(BadDistribution) as info:
        parse_distribution(text, **options)
    assert (info.value.rule, info.value.kind) == (rule, kind)
    assert isinstance(info.value, UsageError) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("parse", "fragment"),
    [(lambda: IntDist.parse("0", what="--tokens-per-event"),
      "--tokens-per-event: '0' needs 1 <= A <= B; give an integer K >= 1 or a range A-B, "
      "e.g. --tokens-per-event 1-3"),
     (lambda: IntDist.parse("1.5", what="--output-len"), "--output-len: '1.5' is not `K` or `A-B` (integers)"),
     (lambda: IntDist.parse("U(1,2)", what="--output-len"), "is not `K` or `A-B`"),
     (lambda: parse_spread("--think-time", "exp(-1)"),
      "--think-time 'exp(-1)': exp(mean) needs mean >= 0; give S, U(a,b), N(mean,sd) or exp(mean) "
      "(seconds >= 0), e.g. --think-time exp(2)"),
     (lambda: parse_spread("--turns", "N(3,1)", integer=True), "--turns 'N(3,1)': not understood"),
     (lambda: parse_workload("N(10,2)/(8,-1)"),
      "workload N(10,2)/(8,-1): the output sd of N(mean,sd) needs sd >= 0, not -1; e.g. N(2048,512)/(256,64)"),
     (lambda: parse_workload("U(9,3)/(1,2)"), "the prompt bounds of U(min,max) need min <= max, not 9 > 3"),
     (lambda: parse_workload("D(x,8)"), "workload component 'D(x,8)' is not understood"),
     (lambda: parse_workload("N(1,2,3)/(1,2)"), "workload component 'N(1,2,3)/(1,2)' is not understood")],
)  # fmt: skip
def test_each_user_words_the_refusal_in_one_line(parse: object, fragment: str) -> None:
    with pytest.raises(UsageError) as info:
        parse()  # type: ignore[operator]
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_documented_examples_parse() -> None:
    """The spellings README.md, docs/*.md and examples/ show."""
    for text in ("3", "U(2,6)", "U(2,4)", "U(2,5)"):
        parse_spread("--turns", text, integer=True)
    for text in ("0", "2", "exp(2)", "U(0.2,1)", "U(1,3)", "N(2,0.5)", "0.5"):
        parse_spread("--think-time", text)
    for text in ("1", "1-3", "16-128", "64-512"):
        IntDist.parse(text)
    for spec in ("D(128,64)", "0.7*D(128,64)+0.3*N(2048,512)/(256,64)", "U(64,256)/(16,128)",
                 "0.7*D(128,64)+0.3*U(256,1024)/(32,128)", "0.7*N(1024,256)/(256,64)+0.3*U(64,512)/(16,512)"):  # fmt: skip
        parse_workload(spec)
    assert set(SPELLINGS) == {"K", "A-B", "U", "N", "exp"}


def test_the_grammar_and_the_simulator_load_without_locust_or_gevent() -> None:
    code = (
        "import sys, analysis.kernel.distribution, infra.simserver, infra.simserver.options\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in ('locust', 'gevent')]\n"
        "assert not bad, bad\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
