"""`llmload check` output: a plain-text table for people, JSON for machines."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from infra.check.checks import CheckReport, Learned

_STATUS = {"pass": "pass", "fail": "FAIL", "skip": "skip"}


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in rows
    ]


def _learned_rows(learned: Learned) -> list[tuple[str, str]]:
    def show(value: Any) -> str:
        if value is None:
            return "?"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return f"{value:.2f} s"
        return str(value)

    rows = [
        ("model", show(learned.model)),
        ("max_model_len", show(learned.max_model_len)),
        ("server version", show(learned.server_version)),
        ("server header", show(learned.server_header)),
        ("simulated", "YES: not real inference performance" if learned.simulated else "no"),
        ("ignore_eos", show(learned.ignore_eos)),
        ("stream_options", show(learned.stream_options)),
        ("usage in stream", show(learned.usage_in_stream)),
        ("[DONE] sent", show(learned.done_sent)),
        ("running gauge", show(learned.running_gauge)),
    ]
    if learned.ready_s is not None:
        rows.append(("cold start (ready)", show(learned.ready_s)))
    return rows


def render_text(report: CheckReport) -> str:
    checks = [("check", "result", "detail")]
    checks += [(c.name, _STATUS[c.status], c.detail) for c in report.checks]
    learned = [("learned", ""), *_learned_rows(report.learned)]
    verdict = "all required checks passed" if report.ok else "a required check FAILED"
    lines = [
        f"llmload check {report.url}",
        "",
        *_columns(checks),
        "",
        *_columns(learned),
        "",
        verdict,
    ]
    return "\n".join(lines) + "\n"


def render_json(report: CheckReport) -> str:
    return json.dumps(report.to_json(), indent=2) + "\n"
