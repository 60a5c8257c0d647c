"""What the master can learn of the target without load: its models, version, server header,
and whether it says it is simulated. Every request is a probe recorded for the manifest."""

from __future__ import annotations

import logging
from typing import Any

from locustfiles.request.client import new_pool
from locustfiles.request.exchange import Reply
from locustfiles.run.manifest import ProbeRecord
from locustfiles.run.probe import send_probe, served_models

log = logging.getLogger("llmload.master")


def probe_target(
    host: str,
    api_key: str | None = None,
    timeout: float = 5.0,
    probes: list[ProbeRecord] | None = None,
) -> dict[str, Any]:
    """What the master can learn of the target without load (never raises).

    Each request carries its own `X-Request-Id: probe-<hex>` and is appended to `probes`.
    """
    info: dict[str, Any] = {"url": host, "model": None, "simulated": False,
                            "server_version": None, "server_header": None}  # fmt: skip
    base = host.rstrip("/")
    noted = probes if probes is not None else []
    pool = new_pool()

    def get(path: str, purpose: str) -> Reply:
        sent = send_probe(pool, purpose, "GET", base + path, api_key=api_key, timeout=timeout)
        noted.append(sent.record)
        return sent.reply

    try:
        models = get("/v1/models", "target_models")
        info["server_header"] = models.headers.get("server")  # none without an answer
        if models.headers.get("x-llmload-simulated", "").lower() == "true":
            info["simulated"] = True
        doc = models.json()
        if not isinstance(doc, dict):
            log.warning("llmload: could not list models at %s/v1/models", base)
        elif served := served_models(doc):
            info["model"] = served[0]
        version = get("/version", "target_version")
        body = version.json()
        if version.status is not None and version.status < 400 and isinstance(body, dict):
            info["server_version"] = str(body.get("version"))
            if body.get("simulated"):
                info["simulated"] = True
    finally:
        pool.clear()
    return info
