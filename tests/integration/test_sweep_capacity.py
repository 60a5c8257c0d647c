"""A sweep of capacity searches: each configuration's capacity under the SLO, ranked, from
hand-made runs (tests/integration/test_report_rates.py's three rate steps)."""

from __future__ import annotations

import json
from pathlib import Path

from analysis.compare.sweep import SweepEntry, build_sweep
from analysis.compare.sweep_report import config_table, write_sweep
from tests.integration.test_report_rates import SEARCH_SLO, probe, rate_run, search_block


def test_the_sweep_ranks_each_configuration_by_its_capacity(tmp_path: Path) -> None:
    # a: found 5 requests/s live (its exact verdicts say 6); b: every level passed live
    # (the events fail its 8 requests/s step: exactly, 6); c: no search
    found = rate_run("a", search=search_block()).write(tmp_path / "events")
    above = rate_run("b", search=search_block(
        status="all_passed", result={"level": 8.0, "step": 2},
        probes=[probe(0, 5.0, True), probe(1, 6.0, True), probe(2, 8.0, True)],
    )).write(tmp_path / "events")  # fmt: skip
    plain = rate_run("c").write(tmp_path / "events")
    sweep = build_sweep([SweepEntry("a", found), SweepEntry("b", above), SweepEntry("c", plain)],
                        resamples=200)  # fmt: skip

    by_config = {c.config: c for c in sweep.capacities}
    assert sorted(by_config) == ["a", "b"]  # c ran no search: no capacity
    assert (by_config["a"].level, by_config["a"].level_exact) == (5.0, 6.0)
    assert (by_config["b"].level, by_config["b"].level_exact) == (8.0, 6.0)
    assert by_config["b"].text == "above 8.0 requests/s (every level passed)"
    assert sweep.capacity_line("default") == (
        f"capacity under the SLO {SEARCH_SLO} (search by rate): b above 8.0 requests/s "
        "(every level passed); a 5.0 requests/s (the events' exact verdicts put b, a "
        "elsewhere: see each run's report)"
    )
    assert sweep.headlines("default")[1] == sweep.capacity_line("default")
    assert [p.level for p in sweep.points if p.config == "a"] == [5.0, 6.0, 8.0]

    headers, rows = config_table(sweep)
    column = headers.index("capacity under the SLO")
    assert [row[column] for row in rows] == ["5.0 requests/s", by_config["b"].text, "—"]

    files = write_sweep(sweep, tmp_path / "out")
    doc = json.loads(files["sweep.json"].read_text())
    assert [c["text"] for c in doc["capacities"]] == ["5.0 requests/s", by_config["b"].text]
    assert doc["capacity_lines"]["default"] == sweep.capacity_line("default")
    assert sweep.capacity_line("default") in files["sweep.md"].read_text()
