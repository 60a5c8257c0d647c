"""How complete a run's events are: what was found against what the manifest and the
workers' indexes recorded, the losses the workers' sinks reported, and one line per problem.

analysis.read.load fills a Completeness while it reads; the report prints its warnings and
summary.json keeps `to_dict()` (docs/reports.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analysis.kernel.errors import EventDataError
from analysis.kernel.layout import TABLE_NAMES, WorkerIndex

_MAX_NAMED = 10


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_NAMED])
    more = len(items) - _MAX_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


@dataclass
class Completeness:
    """What was found against what the manifest and the workers' indexes recorded."""

    workers_expected: list[str] = field(default_factory=list)
    workers_found: list[str] = field(default_factory=list)
    workers_without_final_index: list[str] = field(default_factory=list)
    parts_expected: int = 0
    parts_found: int = 0
    parts_read: int = 0
    rows_expected: dict[str, int] = field(default_factory=dict)
    rows_read: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLE_NAMES, 0))
    missing_parts: list[str] = field(default_factory=list)
    corrupt_parts: dict[str, str] = field(default_factory=dict)  # key -> reason
    unindexed_parts: list[str] = field(default_factory=list)
    row_mismatches: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (exp, read)
    # what the workers' sinks reported losing (manifest `workers[]`): worker -> rows, messages
    rows_rejected: dict[str, int] = field(default_factory=dict)  # bad rows refused at encoding
    rows_dropped: dict[str, int] = field(default_factory=dict)  # rows appended after close
    sink_errors: dict[str, list[str]] = field(default_factory=dict)  # first messages
    # workers whose sink report never reached the master at the end (lost mid-run, or not
    # flushed in time) and whose own index is not final: worker -> host; and the command
    # that uploads what their spools hold
    workers_unconfirmed: dict[str, str] = field(default_factory=dict)
    upload_command: str = "llmload upload-spool SPOOL_DIR --events-uri EVENTS_URI"

    @property
    def workers_missing(self) -> list[str]:
        return sorted(set(self.workers_expected) - set(self.workers_found))

    @property
    def complete(self) -> bool:
        return not (
            self.missing_parts
            or self.corrupt_parts
            or self.row_mismatches
            or self.workers_missing
            or self.workers_without_final_index
            or self.workers_unconfirmed
            or self.rows_rejected
            or self.rows_dropped
        )

    def warnings(self) -> list[str]:
        """One line per problem, naming the parts and workers concerned."""
        out = []
        if self.missing_parts:
            out.append(
                f"{len(self.missing_parts)} part(s) recorded in worker indexes are missing "
                f"(skipped): {_names(self.missing_parts)}"
            )
        if self.corrupt_parts:
            named = [f"{k} ({r})" for k, r in self.corrupt_parts.items()]
            out.append(
                f"{len(self.corrupt_parts)} part(s) could not be read (skipped): {_names(named)}"
            )
        if self.row_mismatches:
            named = [f"{k} (index {e}, read {r})" for k, (e, r) in self.row_mismatches.items()]
            out.append(f"{len(named)} part(s) hold other row counts than indexed: {_names(named)}")
        for worker, host in self.workers_unconfirmed.items():  # the cause of the two below
            out.append(
                f"worker {worker} on {host} did not confirm its events to the master (it was "
                "lost during the run, or did not flush within --finish-timeout): its parts may "
                f"be missing here, waiting in its spool; on {host} run `{self.upload_command}`, "
                "then report again"
            )
        missing = [w for w in self.workers_missing if w not in self.workers_unconfirmed]
        if missing:
            out.append(f"{len(missing)} worker(s) in the manifest left no parts: {_names(missing)}")
        unfinal = [w for w in self.workers_without_final_index if w not in self.workers_unconfirmed]
        if unfinal:
            out.append(
                f"{len(unfinal)} worker(s) have no final index, so "
                f"their parts cannot be checked: {_names(unfinal)}"
            )
        for worker, rows in self.rows_rejected.items():
            reasons = self.sink_errors.get(worker) or ["no reason recorded"]
            out.append(f"worker {worker}'s event sink rejected {rows} row(s): {reasons[0]}")
        for worker, rows in self.rows_dropped.items():
            out.append(
                f"worker {worker}'s event sink dropped {rows} row(s) appended after it closed"
            )
        return out

    def note_sinks(self, workers: list[Any]) -> None:
        """Take the rows each worker's sink rejected or dropped from the manifest's workers."""
        for worker in workers:
            if not isinstance(worker, dict) or not worker.get("worker_id"):
                continue
            name = str(worker["worker_id"])
            lost = {"rows_rejected": self.rows_rejected, "rows_dropped": self.rows_dropped}
            for key, counts in lost.items():
                value = worker.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    counts[name] = value
            errors = worker.get("sink_errors")
            if isinstance(errors, list) and errors:
                self.sink_errors[name] = [str(e) for e in errors]

    def to_dict(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "workers_expected": self.workers_expected,
            "workers_found": self.workers_found,
            "workers_missing": self.workers_missing,
            "workers_without_final_index": self.workers_without_final_index,
            "workers_unconfirmed": self.workers_unconfirmed,
            "parts_expected": self.parts_expected,
            "parts_found": self.parts_found,
            "parts_read": self.parts_read,
            "rows_expected": self.rows_expected,
            "rows_read": self.rows_read,
            "missing_parts": self.missing_parts,
            "corrupt_parts": self.corrupt_parts,
            "unindexed_parts": self.unindexed_parts,
            "row_mismatches": {k: list(v) for k, v in self.row_mismatches.items()},
            "rows_rejected": self.rows_rejected,
            "rows_dropped": self.rows_dropped,
            "sink_errors": self.sink_errors,
        }


def note_unconfirmed(
    comp: Completeness, manifest: dict[str, Any], indexes: dict[str, WorkerIndex]
) -> None:
    """Workers of an ended run whose sink report the master never got (`rows_rejected`
    null: the master lost them) and whose own index is not final (their sink has not
    delivered everything yet); and the command that uploads what their spools hold."""
    if manifest.get("status") not in ("finished", "aborted"):
        return
    for worker in manifest.get("workers") or []:
        if not isinstance(worker, dict) or not worker.get("worker_id"):
            continue
        name = str(worker["worker_id"])
        unconfirmed = "rows_rejected" in worker and worker["rows_rejected"] is None
        index = indexes.get(name)
        if unconfirmed and not (index is not None and index.final):
            comp.workers_unconfirmed[name] = str(worker.get("host") or "its host")
    config = manifest.get("config") or {}
    spool = str(config.get("spool_dir") or "") or "<system temp>/llmload-spool"
    events = str(config.get("events_uri") or "") or "EVENTS_URI"
    comp.upload_command = f"llmload upload-spool {spool} --events-uri {events}"


def refuse_unreadable_requests(run_uri: str, keys: list[str], comp: Completeness) -> None:
    """A run whose every requests part is unreadable has nothing to report: refuse it.

    One unreadable part among readable ones is skipped and named (completeness, warnings).
    """
    if keys and all(k in comp.corrupt_parts for k in keys):
        first = keys[0]
        raise EventDataError(
            f"none of the {len(keys)} requests part(s) of {run_uri} can be read (first: "
            f"{first}: {comp.corrupt_parts[first]}); check that the store holds the parts "
            "the workers wrote, or upload them again from their spool (llmload upload-spool)"
        )


def refuse_all_missing(run_id: str, run_uri: str, comp: Completeness) -> None:
    """A run whose every part the workers' indexes list is missing, with nothing read besides,
    would be a report of zeros: refuse it, with the command that uploads the workers' spools.
    """
    expected = comp.parts_expected
    if expected and len(comp.missing_parts) == expected and comp.parts_read == 0:
        raise EventDataError(
            f"run {run_id} at {run_uri}: all {expected} part(s) the workers' indexes list are "
            "missing, so there is nothing to report; they may still wait in the workers' "
            f"spools: on each worker's host run `{comp.upload_command}`, then report again"
        )
