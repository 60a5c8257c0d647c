"""`manifest.json`: what a run was (docs/events.md), written by the master at start and end.

    manifest = RunManifest(run_id, config=vars(options), target={"url": host, "model": m})
    write_manifest(store, manifest)              # at test_start: status "running"
    manifest.steps.append(StepRecord(0, 8, started_at_ns=time.time_ns()))
    manifest.workers.append(WorkerInfo(worker_id, host, pid))
    write_manifest(store, manifest)              # whenever the timeline changes (optional)
    manifest.finish("finished")                  # or "aborted"
    write_manifest(store, manifest)              # at test_stop / quitting

A run id names one run: the first write of a manifest is a create-only put, refused
(ObjectExistsError) when another run already holds the id; later writes of the same run
replace the object whole (an S3 put is atomic; the file store renames), so a reader sees the
previous manifest or the new one, never a mix. `run_taken` says whether an id is free. Secrets are removed twice:
config keys with secret names are dropped (`locustfiles.run.secrets`), and the values of
secret-named environment variables are redacted wherever they appear (a URL with a key in
its query, a header line). User names and passwords in URLs are removed.
"""

from __future__ import annotations

import json
import os
import platform
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from analysis.kernel.layout import MANIFEST_NAME, run_key
from analysis.kernel.schema import SCHEMA_VERSION
from analysis.kernel.storage import ObjectStore
from locustfiles.run.secrets import is_secret_name, names_env_var, redact, secret_values

MANIFEST_KIND = "llmload.manifest"
MANIFEST_STATUSES = ("running", "finished", "aborted")
TARGET_FIELDS = ("url", "model", "simulated", "server_version", "server_header")


@dataclass
class StepRecord:
    """One step of the actual timeline (master wall clock, ns since the epoch)."""

    step: int
    concurrency: int
    started_at_ns: int
    spawned_at_ns: int | None = None
    ended_at_ns: int | None = None
    warmup_s: float = 0.0
    # open loop (rate steps; None in concurrency steps): the intended global rate
    # (requests/s), the arrival process, the cap and what to do over it, and the workers that
    # shared the schedule, in share order (arrival i goes to workers[i % len(workers)])
    rate: float | None = None
    arrival: str | None = None
    max_concurrency: int | None = None
    over_cap: str | None = None
    share_workers: list[str] | None = None
    # --cache-phase: what ran before the step (locustfiles/master/cachephase.py
    # CachePhaseRecord: phase, flush, flush_route, flush_detail, primed, prime_failed)
    cache_phase: dict[str, Any] | None = None


@dataclass(frozen=True)
class WorkerInfo:
    """One worker: who it was, how its clock sat against the master's, what its sink lost.

    `clock_offset_ms` is the worker's wall clock minus the master's (NTP-style exchange, the
    sample with the smallest round trip kept), `clock_rtt_ms` that sample's round trip; both
    None if never measured. The `rows_*` counts and `sink_errors` come from the worker's sink
    report at the end handshake; None (and no errors) if it never arrived. `sse_reader`: the
    SSE reader the worker ran, "native" (the C decoder) or "python" (where the extension was
    not built); None from a worker that did not say.
    """

    worker_id: str
    host: str
    pid: int
    clock_offset_ms: float | None = None
    clock_rtt_ms: float | None = None
    rows_rejected: int | None = None
    rows_dropped: int | None = None
    sink_errors: tuple[str, ...] = ()
    sse_reader: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "sink_errors": list(self.sink_errors)}


PROBE_PURPOSES = (
    "models",
    "ignore_eos",
    "continuous_usage",
    "calibration",
    "preflight",
    "model",
    "first_request",
    "target_models",
    "target_version",
    "cache_flush",
    "cache_prime",
)


@dataclass(frozen=True)
class ProbeRecord:
    """A request llmload sent to the target outside the load (no request row): a probe.

    `outcome` is "ok" or what went wrong ("http 422", "connect error: ..."); `worker_id` is
    None for the master's own probes. Sent and recorded by `locustfiles.run.probe`.
    """

    request_id: str
    purpose: str
    http_status: int | None
    outcome: str
    worker_id: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeRecord:
        status = data.get("http_status")
        return cls(
            str(data.get("request_id")),
            str(data.get("purpose")),
            status if isinstance(status, int) else None,
            str(data.get("outcome")),
            str(data["worker_id"]) if data.get("worker_id") is not None else None,
        )


@dataclass
class RunManifest:
    run_id: str
    config: Mapping[str, Any] = field(default_factory=dict)
    target: Mapping[str, Any] = field(default_factory=dict)
    status: str = "running"
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    ended_at: datetime | None = None
    hosts: list[str] = field(default_factory=lambda: [socket.gethostname()])
    workers: list[WorkerInfo] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    cold_start: Mapping[str, Any] = field(default_factory=lambda: {"requests": 0, "concurrency": 0})
    versions: Mapping[str, str] = field(default_factory=lambda: collect_versions())
    probes: list[ProbeRecord] = field(default_factory=list)  # requests outside the load
    search: Mapping[str, Any] | None = (
        None  # capacity search (--search): locustfiles/master/search.py
    )
    # whether this run's manifest is in the store (its first write created it): later writes
    # replace it, a first write never replaces another run's (not part of the document)
    stored: bool = field(default=False, repr=False, compare=False)
    stopped_by: str | None = None  # the signal that stopped the run early (SIGTERM, SIGINT)
    # the engine's spans received on the master (--otlp-listen): locustfiles/master/otlp.py
    spans: Mapping[str, Any] | None = None
    # the accelerators' telemetry (--accelerator-metrics): locustfiles/master/accelerator.py;
    # {source (no credentials), kind: dcgm|nvml, interval_s, samples, failures, parts, absent}
    accelerator: Mapping[str, Any] | None = None
    # --stop-when overloaded skipped the remaining levels (locustfiles/master/search.py):
    # {after_step, level, reason, skipped_levels, rule}; None when it did not
    stopped: Mapping[str, Any] | None = None

    def finish(self, status: str = "finished") -> None:
        if status not in MANIFEST_STATUSES[1:]:
            raise ValueError(f"a run ends {MANIFEST_STATUSES[1:]}, not {status!r}")
        self.status = status
        self.ended_at = datetime.now(UTC)

    def to_dict(self, secrets: tuple[str, ...] = ()) -> dict[str, Any]:
        """The manifest document, scrubbed of secret-named keys and of `secrets` values."""
        if self.status not in MANIFEST_STATUSES:
            raise ValueError(f"manifest status {self.status!r} is not one of {MANIFEST_STATUSES}")
        target = {name: self.target.get(name) for name in TARGET_FIELDS}
        target["simulated"] = bool(target["simulated"])
        if self.target.get("models"):  # a model mix (--model a:0.7,b:0.3): each one's share
            target["models"] = dict(self.target["models"])
        hosts = sorted({*self.hosts, *(w.host for w in self.workers)})
        doc = {
            "schema_version": SCHEMA_VERSION,
            "kind": MANIFEST_KIND,
            "run_id": self.run_id,
            "status": self.status,
            "created_at": _iso(self.created_at),
            "ended_at": _iso(self.ended_at) if self.ended_at else None,
            "target": target,
            "config": scrub_config(self.config),
            "versions": dict(self.versions),
            "hosts": hosts,
            "workers": [w.to_dict() for w in self.workers],
            "steps": [_step_doc(s) for s in self.steps],
            "cold_start": dict(self.cold_start),
            "probes": [vars(p) for p in self.probes],
            "search": dict(self.search) if self.search is not None else None,
            "stopped_by": self.stopped_by,
            "stopped": dict(self.stopped) if self.stopped is not None else None,
        }
        if self.spans is not None:
            doc["spans"] = dict(self.spans)
        if self.accelerator is not None:
            doc["accelerator"] = scrub_config(dict(self.accelerator))  # a URL's user info goes
        scrubbed: dict[str, Any] = _scrub_values(doc, secrets)
        return scrubbed


def write_manifest(
    store: ObjectStore, manifest: RunManifest, *, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Write `<run_id>/manifest.json` atomically; return it.

    The first write (`manifest.stored` false) creates the object and raises ObjectExistsError
    when the key is taken (another run's manifest, left as it is); later writes replace it.
    """
    named = manifest.config.get("api_key_env")
    names = (named,) if isinstance(named, str) else ()
    secrets = secret_values(os.environ if environ is None else environ, names)
    doc = manifest.to_dict(secrets)
    data = json.dumps(doc, indent=1, default=str).encode() + b"\n"
    store.put(run_key(manifest.run_id, MANIFEST_NAME), data, overwrite=manifest.stored)
    manifest.stored = True
    return doc


def run_taken(store: ObjectStore, run_id: str) -> bool:
    """Whether the store holds a run of this id: its manifest or any object under `<run_id>/`.

    Store errors are raised (StorageError, OSError)."""
    return store.exists(run_key(run_id, MANIFEST_NAME)) or bool(store.list(run_key(run_id, "")))


def collect_versions() -> dict[str, str]:
    """llmload, locust and python versions, read from metadata (locust is not imported)."""

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    llmload = version("llmload")
    return {
        "llmload": "0+unknown" if llmload == "not installed" else llmload,
        "locust": version("locust"),
        "python": platform.python_version(),
    }


def scrub_config(config: Any) -> Any:
    """Drop secret-named keys (recursively); keep keys that name an environment variable."""
    if isinstance(config, Mapping):
        out = {}
        for key, value in config.items():
            name = str(key)
            if is_secret_name(name) and not names_env_var(name, value):
                continue
            out[name] = scrub_config(value)
        return out
    if isinstance(config, list | tuple):
        return [scrub_config(v) for v in config]
    if isinstance(config, str) and "://" in config:
        return scrub_url(config)
    return config


def scrub_url(url: str) -> str:
    """Remove user info and secret-named query parameters from a URL."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    query = urlencode(
        [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not is_secret_name(k)]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _scrub_values(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {k: _scrub_values(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_values(v, secrets) for v in value]
    if isinstance(value, str):
        return redact(scrub_url(value) if "://" in value else value, secrets)
    return value


def _step_doc(step: StepRecord) -> dict[str, Any]:
    """A step as the manifest holds it: `cache_phase` only where --cache-phase ran one."""
    doc = dict(vars(step))
    if doc["cache_phase"] is None:
        del doc["cache_phase"]
    return doc


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
