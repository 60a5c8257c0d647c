"""A probe: one request llmload sends to the target outside the load, recorded whatever
happens to it as a ProbeRecord (the manifest's `probes`).

    sent = send_probe(pool, "models", "GET", base + "/v1/models", api_key=key)
    probes.append(sent.record)            # its id, purpose, status and outcome
    sent.reply.status, sent.reply.json()  # what came back (reply.error: nothing did)

    record, probe = send_stream_probe(pool, "continuous_usage", url, body, limits, ...)

Every probe carries its own `X-Request-Id: probe-<hex>`. Its outcome is "ok", "http 422",
"connect error: ..." (no connection, `locustfiles.request.errors`), the exception, or for a
streamed probe its failure kind and detail. The master, its preflight and the workers all
probe through here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

import urllib3

from analysis.kernel.spans import traceparent
from locustfiles.request.client import Limits, execute
from locustfiles.request.errors import CONNECT, describe
from locustfiles.request.exchange import Reply, exchange
from locustfiles.request.record import RequestRecord
from locustfiles.run.manifest import ProbeRecord
from locustfiles.run.secrets import redact

PROBE_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class SentProbe:
    record: ProbeRecord  # for the manifest
    reply: Reply  # what came back


def new_probe_id() -> str:
    return "probe-" + uuid.uuid4().hex


def probe_headers(request_id: str, api_key: str | None) -> dict[str, str]:
    """The headers of every request llmload sends, probe or load: its id, the W3C trace
    context whose trace id is derived from the id (an engine's span joins the request by it:
    analysis/kernel/spans.py), the API key when there is one."""
    headers = {"X-Request-Id": request_id, "traceparent": traceparent(request_id)}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def send_probe(
    pool: urllib3.PoolManager,
    purpose: str,
    method: str,
    url: str,
    *,
    body: dict[str, Any] | None = None,
    api_key: str | None = None,
    timeout: float = PROBE_TIMEOUT_S,
    request_id: str | None = None,
    worker_id: str | None = None,
    secrets: tuple[str, ...] = (),
) -> SentProbe:
    """Send one probe and record it; never raises for the target's sake (see reply.error).

    `request_id`: the id to send (a probe tried again keeps its id); `secrets`: values to
    redact from the outcome (a worker's own environment)."""
    rid = request_id or new_probe_id()
    reply = exchange(pool, method, url, body, probe_headers(rid, api_key), timeout)
    record = ProbeRecord(rid, purpose, reply.status, redact(reply_outcome(reply), secrets),
                         worker_id)  # fmt: skip
    return SentProbe(record, reply)


def send_stream_probe(
    pool: urllib3.PoolManager,
    purpose: str,
    url: str,
    body: dict[str, Any],
    limits: Limits,
    *,
    endpoint: str,
    model: str | None,
    api_key: str | None = None,
    worker_id: str | None = None,
    secrets: tuple[str, ...] = (),
) -> tuple[RequestRecord, ProbeRecord]:
    """A probe read like any request of the load (`execute`; streamed as `body` says), its
    record too."""
    rid = new_probe_id()
    stream = bool(body.get("stream"))
    record = RequestRecord(rid, -1, 1, False, "probe", endpoint, model, stream, None,
                           body.get("max_tokens"), "")  # fmt: skip
    execute(pool, url, body, probe_headers(rid, api_key), record, limits)
    outcome = redact(record_outcome(record), secrets)
    return record, ProbeRecord(rid, purpose, record.http_status, outcome, worker_id)


def reply_outcome(reply: Reply) -> str:
    """A probe's outcome from its reply: "ok", "http 404", "connect error: ..." or the error."""
    if reply.error is not None:
        text = describe(reply.error)
        return f"connect error: {text}" if reply.failure == CONNECT else text
    return "ok" if reply.status == 200 else f"http {reply.status}"


def record_outcome(record: RequestRecord) -> str:
    """A streamed probe's outcome from its request record: "ok", "http 422" or the failure."""
    if record.status == "ok":
        return "ok"
    if record.http_status is not None and record.http_status != 200:
        return f"http {record.http_status}"
    return f"{record.error_kind}: {record.error_detail or ''}"[:200]


def served_models(doc: Any) -> list[str]:
    """The model ids of a `/v1/models` answer (empty: none listed, or not such an answer). The one
    reading of that answer: the preflight, the target's description, the worker's probes and
    `llmload check` all call it."""
    data = doc.get("data") if isinstance(doc, dict) else None
    models = data if isinstance(data, list) else []
    return [str(m["id"]) for m in models if isinstance(m, dict) and m.get("id") is not None]
