"""Sessions (schema 1.3): multi-turn conversations and agent tool rounds, one row per session.

A session is the requests that share a `session_id` (one Locust user's conversation, or one
open-loop arrival's), sent one after another by one worker. Dropped arrivals were never sent
and belong to no session. Per session (docs/metrics.md, "Sessions"):

- status `error`: a turn failed (status `error`); a failed turn ends its session;
- status `cut`: no turn failed, but a turn was aborted or cancelled (the run's end), or turns
  are missing: fewer user turns than planned (`session_turns`), a tool call without its
  `tool_result` turn, or a gap in the turn indices;
- status `complete`: every planned user turn and every tool round it needed, present and ok;
- `model_s` = the sum of its requests' E2E (time the server had the session's requests);
- `tool_wait_s` / `think_s` = the sum of `wait_ns` of its `tool_result` / user turns;
- `session_e2e_s` = its last response end − its first send (one worker's clock).

Per step, the sessions whose first turn was sent in the step's steady window; their
distributions (turns, session E2E, waits) cover the complete ones, since a cut or failed
session's sums stop short. The by-turn table pools the steady requests of every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pandas as pd

from analysis.derive.parts import GroupView, Part, RowPart, RunView
from analysis.derive.stats import SortedSamples

NS_PER_S: Final = 1e9

SESSION_STATUSES: Final = ("complete", "error", "cut")

SESSION_COLUMNS: Final = (
    "session_id",
    "worker_id",
    "step",
    "turns",
    "planned_turns",
    "ok_turns",
    "tool_rounds",
    "status",
    "model_s",
    "tool_wait_s",
    "think_s",
    "session_e2e_s",
    "started_at_ns",
    "prompt_tokens",
    "cached_tokens",
)
"""Columns of sessions.csv / sessions.parquet, in order."""

STEP_SESSION_COLUMNS: Final = (
    "sessions",
    "sessions_complete",
    "sessions_error",
    "sessions_cut",
    "session_turns_mean",
    "session_e2e_p50_s",
    "session_e2e_p99_s",
    "tool_wait_s_mean",
    "think_s_mean",
)
"""Per-step summary columns of a run's sessions (missing for runs without sessions)."""

TURN_COLUMNS: Final = (
    "turn",
    "requests",
    "ttft_p50_s",
    "ttft_p99_s",
    "prompt_tokens_mean",
    "cached_tokens_mean",
    "cache_hit_pct",
)
"""Columns of the by-turn table (summary.json `turns`)."""


_NO_END: Final = np.iinfo(np.int64).min


def float_column(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A numeric request column as float64, NaN where missing (all NaN when absent). Exact
    for the int32 columns and for ns offsets below 2**53 (104 days)."""
    if column not in frame:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(np.float64, na_value=np.nan)


def _nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    """Whole numbers held as float64 (NaN missing) as pandas Int64."""
    missing = np.isnan(values)
    return pd.arrays.IntegerArray(np.where(missing, 0, values).astype(np.int64), missing)


def _mean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else float("nan")


def _turn_kinds(requests: pd.DataFrame) -> np.ndarray:
    """Per request: its turn kind, `user` where none was recorded."""
    if "turn_kind" not in requests:
        return np.full(len(requests), "user", dtype=object)
    kinds = requests["turn_kind"].to_numpy(object)
    return np.where(pd.isna(kinds), "user", kinds)


def first_turns(requests: pd.DataFrame) -> np.ndarray:
    """Per request: it is an arrival, a single request or a session's first turn (turn null
    or 0), not a later turn of a session."""
    return np.nan_to_num(float_column(requests, "turn")) == 0


def without_history(requests: pd.DataFrame) -> np.ndarray:
    """Per request: its prompt carries no earlier turn (turn null or 0, turn_kind null or
    `user`), so its server prompt count can be held against `prompt_tokens_requested`."""
    return first_turns(requests) & (_turn_kinds(requests) == "user")


def cached_tokens_pct(requests: pd.DataFrame, mask: np.ndarray) -> float:
    """100 × cached / prompt tokens over the rows of `mask` that report both; NaN for none."""
    if "cached_tokens" not in requests:
        return float("nan")
    cached, prompt = (
        float_column(requests, "cached_tokens"),
        float_column(requests, "prompt_tokens"),
    )
    both = mask & ~np.isnan(cached) & ~np.isnan(prompt)
    total = float(prompt[both].sum())
    return 100.0 * float(cached[both].sum()) / total if total > 0 else float("nan")


def cached_tokens_warning(requests: pd.DataFrame, ok: np.ndarray) -> list[str]:
    """One line when the server reported cached prompt tokens for some successful requests
    with usage and not for others (cache figures then cover only those that did)."""
    if "cached_tokens" not in requests:
        return []
    with_usage = ok & requests["prompt_tokens"].notna().to_numpy(bool)
    reported = with_usage & requests["cached_tokens"].notna().to_numpy(bool)
    return cached_tokens_message(int(reported.sum()), int(with_usage.sum()))


def cached_tokens_message(n: int, total: int) -> list[str]:
    """cached_tokens_warning's line: `n` of `total` successful requests with usage reported
    cached tokens (none when none or all did)."""
    if n == 0 or n == total:
        return []
    return [
        f"the server reported cached prompt tokens (usage.prompt_tokens_details.cached_tokens) "
        f"for {n} of {total} successful requests with usage; cached_tokens_pct and the by-turn "
        "cache figures cover only those that reported them"
    ]


@dataclass(frozen=True)
class SessionTable:
    """One row per session (`frame`, SESSION_COLUMNS) and, per row, the position of the
    session's first turn in the requests table (`first_row`), which places it in a step."""

    frame: pd.DataFrame
    first_row: np.ndarray

    @classmethod
    def of(cls, requests: pd.DataFrame, e2e_s: np.ndarray) -> SessionTable | None:
        """The sessions of a run's requests (E2E per request row); None when no request has
        a `session_id` (single requests, or a run written before schema 1.3)."""
        if "session_id" not in requests:
            return None
        status = requests["status"].astype(str).to_numpy()
        member = requests["session_id"].notna().to_numpy(bool) & (status != "dropped")
        if not member.any():
            return None
        rows = np.flatnonzero(member)
        req = requests.iloc[rows]
        kind = _turn_kinds(req)
        sent = req["sent_at_ns"].to_numpy(np.int64)
        end = float_column(req, "end_ns")
        wait = float_column(req, "wait_ns")
        frame = pd.DataFrame(
            {
                "row": rows,
                "session_id": req["session_id"].astype(str).to_numpy(),
                "worker_id": req["worker_id"].astype(str).to_numpy(),
                "step": req["step"].to_numpy(np.int64),
                "turn": float_column(req, "turn"),
                "planned": float_column(req, "session_turns"),
                "ok": status[rows] == "ok",
                "error": status[rows] == "error",
                "broken": np.isin(status[rows], ("aborted", "cancelled")),
                "user": kind == "user",
                "tool_result": kind == "tool_result",
                "called": np.nan_to_num(float_column(req, "tool_calls")) > 0,
                "e2e_s": e2e_s[rows],
                "sent": sent,
                # wall-clock end, exact in int64 ns; _NO_END where unknown
                "end": np.where(np.isnan(end), _NO_END, sent + np.nan_to_num(end).astype(np.int64)),
                "wait_known": ~np.isnan(wait),
                "tool_wait": np.where(kind == "tool_result", np.nan_to_num(wait), 0.0),
                "think": np.where(kind == "user", np.nan_to_num(wait), 0.0),
                "prompt_tokens": float_column(req, "prompt_tokens"),
                "cached_tokens": float_column(req, "cached_tokens"),
            }
        )
        frame = frame.sort_values(["session_id", "turn", "sent"], kind="stable")
        s = frame.groupby("session_id", sort=False).agg(
            row=("row", "first"),
            worker_id=("worker_id", "first"),
            step=("step", "first"),
            turns=("row", "size"),
            planned_turns=("planned", "max"),
            ok_turns=("ok", "sum"),
            tool_rounds=("tool_result", "sum"),
            user_turns=("user", "sum"),
            calls=("called", "sum"),
            failed=("error", "any"),
            broken=("broken", "any"),
            last_turn=("turn", "max"),
            model_s=("e2e_s", "sum"),
            model_n=("e2e_s", "count"),
            wait_known=("wait_known", "any"),
            tool_wait=("tool_wait", "sum"),
            think=("think", "sum"),
            started_at_ns=("sent", "min"),
            ended_at_ns=("end", "max"),
            prompt_tokens=("prompt_tokens", "sum"),
            prompt_n=("prompt_tokens", "count"),
            cached_tokens=("cached_tokens", "sum"),
            cached_n=("cached_tokens", "count"),
        )

        def col(name: str) -> np.ndarray:
            return s[name].to_numpy(np.float64)

        planned, turns = col("planned_turns"), col("turns")
        missing = (
            (col("user_turns") < planned)  # NaN (not planned) compares False
            | (col("tool_rounds") < col("calls"))
            | (col("last_turn") + 1 > turns)
        )
        failed = s["failed"].to_numpy(bool)
        cut = s["broken"].to_numpy(bool) | missing
        known = s["wait_known"].to_numpy(bool)
        started = s["started_at_ns"].to_numpy(np.int64)
        ended = s["ended_at_ns"].to_numpy(np.int64)
        out = pd.DataFrame(
            {
                "session_id": s.index.to_numpy(),
                "worker_id": s["worker_id"].to_numpy(),
                "step": s["step"].to_numpy(np.int64),
                "turns": s["turns"].to_numpy(np.int64),
                "planned_turns": _nullable(planned),
                "ok_turns": s["ok_turns"].to_numpy(np.int64),
                "tool_rounds": s["tool_rounds"].to_numpy(np.int64),
                "status": np.where(failed, "error", np.where(cut, "cut", "complete")),
                "model_s": np.where(col("model_n") > 0, col("model_s"), np.nan),
                "tool_wait_s": np.where(known, col("tool_wait"), np.nan) / NS_PER_S,
                "think_s": np.where(known, col("think"), np.nan) / NS_PER_S,
                "session_e2e_s": np.where(ended != _NO_END, ended - started, np.nan) / NS_PER_S,
                "started_at_ns": started,
                "prompt_tokens": _nullable(
                    np.where(col("prompt_n") > 0, col("prompt_tokens"), np.nan)
                ),
                "cached_tokens": _nullable(
                    np.where(col("cached_n") > 0, col("cached_tokens"), np.nan)
                ),
            }
        )
        order = np.lexsort((out["session_id"].to_numpy(str), started))
        first_row = s["row"].to_numpy(np.int64)[order]
        return cls(out.iloc[order].reset_index(drop=True), first_row)

    def columns(self, members: np.ndarray) -> dict[str, Any]:
        """Summary columns over the sessions whose first turn is among `members` (a mask
        over request rows); distributions over the complete ones."""
        group = self.frame[members[self.first_row]]
        status = group["status"].to_numpy(str)
        done = group[status == "complete"]
        e2e = SortedSamples.of(done["session_e2e_s"].to_numpy(np.float64))
        p50, p99 = (float(v) for v in e2e.quantiles([0.50, 0.99]))
        return {
            "sessions": len(group),
            "sessions_complete": int((status == "complete").sum()),
            "sessions_error": int((status == "error").sum()),
            "sessions_cut": int((status == "cut").sum()),
            "session_turns_mean": _mean(done["turns"].to_numpy(np.float64)),
            "session_e2e_p50_s": p50,
            "session_e2e_p99_s": p99,
            "tool_wait_s_mean": _mean(done["tool_wait_s"].to_numpy(np.float64)),
            "think_s_mean": _mean(done["think_s"].to_numpy(np.float64)),
        }


def session_columns(table: SessionTable | None, members: np.ndarray) -> dict[str, Any]:
    """A group's session columns; missing (None counts, NaN values) without sessions."""
    if table is not None:
        return table.columns(members)
    counts = {"sessions", "sessions_complete", "sessions_error", "sessions_cut"}
    return {c: None if c in counts else float("nan") for c in STEP_SESSION_COLUMNS}


def turn_rows(per_request: pd.DataFrame) -> list[dict[str, Any]]:
    """The by-turn table: per turn index, over the steady requests of every step (cold,
    ramp and warmup left out; dropped arrivals never sent). Latencies and token figures over
    the successful ones; `cache_hit_pct` = 100 × cached / prompt tokens over those reporting
    both. Empty when no request has a turn index."""
    if "turn" not in per_request:
        return []
    turn = float_column(per_request, "turn")
    status = per_request["status"].astype(str).to_numpy()
    counted = per_request["steady"].to_numpy(bool) & ~np.isnan(turn) & (status != "dropped")
    if not counted.any():
        return []
    index = np.nan_to_num(turn, nan=-1).astype(np.int64)
    ok = counted & (status == "ok")
    ttft = per_request["ttft_s"].to_numpy(np.float64)
    prompt, cached = (
        float_column(per_request, "prompt_tokens"),
        float_column(per_request, "cached_tokens"),
    )
    rows = []
    for t in np.unique(index[counted]):
        at = index == t
        good = ok & at
        p50, p99 = (float(v) for v in SortedSamples.of(ttft[good]).quantiles([0.50, 0.99]))
        rows.append(
            {
                "turn": int(t),
                "requests": int((counted & at).sum()),
                "ttft_p50_s": p50,
                "ttft_p99_s": p99,
                "prompt_tokens_mean": _mean(prompt[good]),
                "cached_tokens_mean": _mean(cached[good]),
                "cache_hit_pct": cached_tokens_pct(per_request, good),
            }
        )
    return rows


@dataclass(frozen=True)
class Sessions(Part):
    """The sessions' part of the summary rows; `table` is the run's sessions (sessions.csv),
    None when it has none."""

    table: SessionTable | None

    @classmethod
    def make(cls, view: RunView) -> Sessions:
        return cls(SessionTable.of(view.run.requests, view.e2e_s))

    def columns(self, group: GroupView) -> dict[str, Any]:
        return session_columns(self.table, group.members)


ROW_PART: Final = RowPart("sessions", Sessions.make)
