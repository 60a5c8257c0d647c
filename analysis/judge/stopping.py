"""A staircase that `--stop-when overloaded` cut short (manifest `stopped`), for the reports.

    stopped_info(manifest)    # the manifest's record, or None (summary.json `stopped`)
    stopped_line(manifest)    # "stopped after step 4 (concurrency 16): ...; skipped levels 32, 64"
    stopped_facts(manifest)   # [("stopped early", line)] for the run facts table, or []

The master's rule (locustfiles/master/overload.py) judged each step on its live statistics;
the record says after which step it stopped, why, and which levels it skipped.
"""

from __future__ import annotations

from typing import Any


def stopped_info(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's `stopped` record (None: the run was not cut short, or an older run)."""
    stopped = manifest.get("stopped")
    return dict(stopped) if isinstance(stopped, dict) else None


def _level(manifest: dict[str, Any], level: Any) -> str:
    rates = (manifest.get("config") or {}).get("rates")
    if not isinstance(level, int | float):
        return "level ?"
    return f"{level:g} requests/s" if rates else f"concurrency {level:g}"


def stopped_line(manifest: dict[str, Any]) -> str | None:
    """One line: after which step the staircase stopped, why, and the levels skipped."""
    stopped = stopped_info(manifest)
    if stopped is None:
        return None
    skipped = [s for s in stopped.get("skipped_levels") or [] if isinstance(s, int | float)]
    where = f"step {stopped.get('after_step', '?')} ({_level(manifest, stopped.get('level'))})"
    search = manifest.get("search") is not None
    what = "capacity search: the coarse phase stopped after" if search else "stopped after"
    reason = stopped.get("reason") or "the server was overloaded"
    levels = ", ".join(f"{s:g}" for s in skipped) or "none"
    then = "; the search bisected below it, though it met the SLO" if search else ""
    return f"{what} {where}: {reason}; skipped levels {levels}{then} (--stop-when overloaded)"


def stopped_facts(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The run facts row of a staircase cut short (empty otherwise)."""
    line = stopped_line(manifest)
    return [] if line is None else [("stopped early", line)]


__all__ = ["stopped_facts", "stopped_info", "stopped_line"]
