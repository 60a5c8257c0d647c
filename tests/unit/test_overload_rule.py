"""`--stop-when overloaded`: the overload rule on plain figures, the plans that apply it (the
staircase and the capacity search's coarse phase), its options and the report's line."""

from __future__ import annotations

from typing import Any

import pytest

from analysis.judge.stopping import stopped_facts, stopped_info, stopped_line
from analysis.kernel.errors import UsageError
from infra.campaign import parse_campaign
from infra.campaign.runner import master_command
from locustfiles.live.groups import GroupStats
from locustfiles.master.overload import OverloadRule, StepFigures, step_figures
from locustfiles.master.search import CapacitySearch, FixedLevels
from locustfiles.request.record import RequestRecord
from tests.unit.test_option_table import MINIMAL, options_from

RULE = OverloadRule()


def figures(step: int, tokens_per_s: float | None, ttft: float | None, finished: int = 100,
            overloaded: int = 0) -> StepFigures:  # fmt: skip
    rps = None if tokens_per_s is None else tokens_per_s / 10
    return StepFigures(step, 2.0**step, finished, overloaded, tokens_per_s, rps, ttft)


def group(
    ttft_s: float, n: int = 100, output_tokens: int = 10, kinds: tuple[str, ...] = ()
) -> GroupStats:
    """A step's live statistics: `n` ok requests of TTFT `ttft_s`, one failed per kind."""
    stats = GroupStats()
    for i in range(n + len(kinds)):
        r = RequestRecord(f"r{i}", 0, 1, False, "s", "chat", "m", True, 8, 4, "")
        r.first_token_ns = r.first_content_ns = int(ttft_s * 1e9)
        r.end_ns = int(ttft_s * 1e9) + 1000
        r.output_tokens = output_tokens
        if i >= n:
            r.fail(kinds[i - n], "boom")
        stats.observe(r)
    return stats


# -- the rule ---------------------------------------------------------------------------


def test_flat_throughput_with_a_grown_ttft_trips() -> None:
    earlier = [figures(0, 100, 0.01), figures(1, 200, 0.01), figures(2, 400, 0.012)]
    reason = RULE.verdict(figures(3, 412, 0.05), earlier)
    assert reason == "throughput flat (+3% tokens/s over step 2), TTFT p50 ×4.2"


def test_growing_throughput_does_not_trip_whatever_the_ttft() -> None:
    earlier = [figures(0, 100, 0.01), figures(1, 200, 0.01)]
    assert RULE.verdict(figures(2, 230, 0.5), earlier) is None  # +15%
    assert RULE.verdict(figures(2, 205, 0.019), earlier) is None  # flat, TTFT x1.9 only
    assert RULE.verdict(figures(0, 100, 0.01), []) is None  # nothing to compare with


def test_the_reference_is_the_earlier_step_with_the_highest_throughput() -> None:
    earlier = [figures(0, 100, 0.01), figures(1, 400, 0.1), figures(2, 300, 0.02)]
    # TTFT x3 over step 2 but x0.6 over step 1, the reference: no trip
    assert RULE.verdict(figures(3, 390, 0.06), earlier) is None
    assert RULE.verdict(figures(3, 392, 0.25), earlier) == (
        "throughput flat (-2% tokens/s over step 1), TTFT p50 ×2.5"
    )


def test_the_thresholds_are_the_options() -> None:
    earlier = [figures(0, 100, 0.01)]
    step = figures(1, 115, 0.025)
    assert RULE.verdict(step, earlier) is None  # +15% grows; TTFT x2.5
    assert OverloadRule(min_growth=0.2).verdict(step, earlier) is not None
    assert OverloadRule(min_growth=0.2, ttft_factor=3).verdict(step, earlier) is None


def test_an_overload_rate_trips_even_a_growing_step() -> None:
    reason = RULE.verdict(
        figures(1, 400, 0.01, finished=200, overloaded=5), [figures(0, 100, 0.01)]
    )
    assert (
        reason == "server overloaded: 2.5% of requests rejected (429/503) or timed out (5 of 200)"
    )
    assert RULE.verdict(figures(1, 400, 0.01, finished=200, overloaded=2), []) is None  # 1%
    assert OverloadRule(overload_rate=0.005).verdict(figures(1, 400, 0.01, 200, 2), []) is not None


def test_missing_figures_do_not_trip_or_crash() -> None:
    earlier = [figures(0, None, None, finished=0), figures(1, 200, None)]
    assert RULE.verdict(figures(2, None, None, finished=0), earlier) is None
    assert RULE.verdict(figures(2, 200, None), earlier) is None  # no TTFT
    assert RULE.verdict(figures(2, None, 0.5), [figures(1, None, None)]) is None
    none = step_figures(3, 8.0, None, 3.0)
    assert (none.finished, none.tokens_per_s, none.ttft_p50_s) == (0, None, None)
    assert RULE.verdict(none, earlier) is None
    assert step_figures(3, 8.0, group(0.1), None).tokens_per_s is None  # no run time


def test_requests_per_second_stand_in_where_tokens_are_missing() -> None:
    def rps(step: int, per_s: float, ttft: float) -> StepFigures:
        return StepFigures(step, 1, 100, 0, None, per_s, ttft)

    reason = RULE.verdict(rps(1, 10.2, 0.09), [rps(0, 10.0, 0.01)])
    assert reason == "throughput flat (+2% requests/s over step 0), TTFT p50 ×9.0"


def test_step_figures_read_the_live_statistics() -> None:
    stats = group(
        0.2, n=97, output_tokens=10, kinds=("queue_rejected", "total_timeout", "http_5xx")
    )
    f = step_figures(4, 16.0, stats, 2.0)
    assert (f.step, f.level, f.finished, f.overloaded) == (4, 16.0, 100, 2)
    assert f.tokens_per_s == pytest.approx(100 * 10 / 2.0)  # every request's tokens
    assert f.requests_per_s == pytest.approx(97 / 2.0)
    assert f.ttft_p50_s == pytest.approx(0.2, rel=0.02)


# -- the plans --------------------------------------------------------------------------


def saturating(level: float) -> GroupStats:
    """A server that saturates at 8: tokens grow with the level up to 8, then TTFT does."""
    return group(0.01 * max(1.0, level / 8) ** 3, n=int(min(level, 8) * 10))


def test_a_staircase_stops_after_the_step_that_trips_the_rule() -> None:
    plan = FixedLevels((1, 2, 4, 8, 16, 32, 64), RULE)
    index, levels = 0, [plan.first()]
    while (nxt := plan.next_level(index, saturating(levels[-1]), 100, elapsed_s=3.0)) is not None:
        levels.append(nxt)
        index += 1
    assert levels == [1, 2, 4, 8, 16]
    assert plan.stopped == {
        "after_step": 4, "level": 16, "reason": "throughput flat (+0% tokens/s over step 3), TTFT p50 ×8.0",
        "skipped_levels": [32, 64], "rule": {"ttft_factor": 2.0, "min_growth": 0.1, "overload_rate": 0.01},
    }  # fmt: skip


def test_without_a_rule_or_at_the_last_step_nothing_is_stopped() -> None:
    plan = FixedLevels((8, 16))
    assert plan.next_level(0, saturating(8), 100, elapsed_s=3.0) == 16
    assert plan.next_level(1, saturating(16), 100, elapsed_s=3.0) is None and plan.stopped is None
    ruled = FixedLevels((8, 16), RULE)
    ruled.next_level(0, saturating(8), 100, elapsed_s=3.0)
    assert ruled.next_level(1, saturating(16), 100, elapsed_s=3.0) is None
    assert ruled.stopped is None  # nothing left to skip


def test_the_search_ends_its_coarse_phase_at_a_saturated_level_and_bisects_below_it() -> None:
    # a loose SLO that every level meets: without the rule the search climbs to 64
    search = CapacitySearch((1, 2, 4, 8, 16, 32, 64), "concurrency", "ttft_p99=10", 0.05, 1, RULE)
    levels = [search.first()]
    index = 0
    while (nxt := search.next_level(index, saturating(levels[-1]), 100, elapsed_s=3.0)) is not None:
        levels.append(nxt)
        index += 1
    assert levels[:5] == [1, 2, 4, 8, 16] and 32 not in levels
    assert all(8 < level < 16 for level in levels[5:]) and levels[5:]
    doc = search.to_dict()
    assert doc is not None and doc["status"] == "found"
    assert doc["probes"][4]["overloaded"].startswith("throughput flat")
    assert doc["probes"][4]["passed"] is True  # it met the SLO: the rule made it the bound
    assert 8 <= doc["result"]["level"] < 16
    assert search.stopped is not None and search.stopped["skipped_levels"] == [32, 64]


def test_the_search_without_the_rule_climbs_on() -> None:
    search = CapacitySearch((1, 8, 16, 32), "concurrency", "ttft_p99=10", 0.05, 1)
    levels = [search.first()]
    index = 0
    while (nxt := search.next_level(index, saturating(levels[-1]), 100, elapsed_s=3.0)) is not None:
        levels.append(nxt)
        index += 1
    assert levels == [1, 8, 16, 32] and search.status == "all_passed" and search.stopped is None


# -- options, campaign keys, the report ----------------------------------------------------


def test_the_options_make_the_rule() -> None:
    from locustfiles.master.search import plan_for

    assert plan_for(options_from([])).stop_rule is None
    opts = options_from(["--stop-when", "overloaded", "--stop-ttft-factor", "3",
                         "--stop-min-growth", "0.2", "--stop-overload-rate", "0.05"])  # fmt: skip
    assert plan_for(opts).stop_rule == OverloadRule(3.0, 0.2, 0.05)
    assert opts.config()["stop_when"] == "overloaded"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stop-ttft-factor", "1"], "--stop-ttft-factor must be a number greater than 1"),
        (["--stop-ttft-factor", "inf"], "--stop-ttft-factor must be a number greater than 1"),
        (["--stop-min-growth", "1.5"], "--stop-min-growth must be between 0 and 1"),
        (["--stop-overload-rate", "0"], "--stop-overload-rate must be between 0 and 1 (exclusive)"),
    ],
)
def test_bad_thresholds_are_refused_in_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as exc:
        options_from(["--stop-when", "overloaded", *argv])
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_campaign_keys_reach_the_master_command() -> None:
    c = parse_campaign({**MINIMAL, "stop_when": "overloaded", "stop_ttft_factor": 3,
                        "stop_min_growth": 0.2, "stop_overload_rate": 0.05})  # fmt: skip
    assert (c.stop_when, c.stop_ttft_factor, c.stop_min_growth, c.stop_overload_rate) == (
        "overloaded", 3.0, 0.2, 0.05,
    )  # fmt: skip
    cmd = master_command(c, c.workload[0], "r1", 1)
    for flag, value in (("--stop-when", "overloaded"), ("--stop-ttft-factor", "3"),
                        ("--stop-min-growth", "0.2"), ("--stop-overload-rate", "0.05")):  # fmt: skip
        assert cmd[cmd.index(flag) + 1] == value
    plain = parse_campaign(MINIMAL)
    assert plain.stop_when == "never"
    assert "--stop-when" not in master_command(plain, plain.workload[0], "r1", 1)
    with pytest.raises(UsageError, match="key 'stop_ttft_factor' must be a number greater than 1"):
        parse_campaign({**MINIMAL, "stop_when": "overloaded", "stop_ttft_factor": 0.5})


def test_the_report_line() -> None:
    stopped: dict[str, Any] = {"after_step": 4, "level": 16, "reason": "throughput flat (+3% tokens/s "
                               "over step 3), TTFT p50 ×11.7", "skipped_levels": [32, 64], "rule": {}}  # fmt: skip
    manifest: dict[str, Any] = {"config": {"rates": []}, "search": None, "stopped": stopped}
    assert stopped_line(manifest) == (
        "stopped after step 4 (concurrency 16): throughput flat (+3% tokens/s over step 3), "
        "TTFT p50 ×11.7; skipped levels 32, 64 (--stop-when overloaded)"
    )
    assert stopped_facts(manifest)[0][0] == "stopped early"
    assert stopped_info(manifest) == stopped
    rate = {"config": {"rates": [1, 2.5]}, "search": {"status": "found"},
            "stopped": {**stopped, "level": 2.5, "skipped_levels": [5]}}  # fmt: skip
    assert stopped_line(rate) == (
        "capacity search: the coarse phase stopped after step 4 (2.5 requests/s): throughput "
        "flat (+3% tokens/s over step 3), TTFT p50 ×11.7; skipped levels 5; the search bisected "
        "below it, though it met the SLO (--stop-when overloaded)"
    )
    for old in ({}, {"stopped": None}, {"stopped": "garbage"}):
        assert stopped_line(old) is None and stopped_info(old) is None and stopped_facts(old) == []
