"""What a worker learns of its target before the first request, and the requests that follow.

Probes run once, lazily, behind a lock, before the first request: the model id
(`/v1/models`), whether the server accepts `ignore_eos` and continuous usage stats, and the
prompt-length calibration. Every probe has its own `probe-<hex>` id and is listed, whatever
its outcome, for the manifest's `probes`: it goes to the master right after probing
(`report_probes`) and again with the finish report. The headers and body of every request
follow from what was learned (`TargetView.headers`, `TargetView.body`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable
from typing import Any

import gevent.lock
import urllib3

from analysis.kernel.schema import TIMEOUT_KINDS
from locustfiles.options.options import ChatOptions
from locustfiles.request.client import Limits
from locustfiles.request.errors import TIMEOUT, TRANSPORT_ERRORS, root_cause, transport_kind
from locustfiles.run.body import request_body
from locustfiles.run.manifest import ProbeRecord
from locustfiles.run.probe import (
    PROBE_TIMEOUT_S,
    probe_headers,
    send_probe,
    send_stream_probe,
    served_models,
)
from locustfiles.traffic.prompts import PromptBuilder

log = logging.getLogger("llmload.worker")


class TargetView:
    """One worker's view of its target: the probes' findings and the request they shape."""

    def __init__(
        self,
        options: ChatOptions,
        base_url: str,
        worker_id: str,
        limits: Limits,
        prompts: PromptBuilder,
        secrets: tuple[str, ...],
        report_probes: Callable[[list[dict[str, Any]]], None] | None = None,
        cannot_start: Callable[[str], None] | None = None,
        probing: bool = True,
    ) -> None:
        self.options = options
        self.probing = probing  # False: a user's own service, not an OpenAI endpoint
        self.base_url = base_url
        self.url = base_url + options.path
        self.worker_id = worker_id
        self.limits = limits
        self.prompts = prompts  # calibrated by the probes
        self.report_probes = report_probes
        self.cannot_start = cannot_start  # a start-up probe timed out: the run must stop
        self.model: str | None = options.model_mix.first  # None: learned from /v1/models
        self.ignore_eos = options.ignore_eos == "on"
        self.continuous_usage = options.continuous_usage == "on"
        self.probes: list[dict[str, Any]] = []  # ProbeRecord dicts, for the manifest
        self._ready = False
        self._lock = gevent.lock.Semaphore()
        self._secrets = secrets
        self._api_key = options.api_key()  # read once: os.environ costs µs per request

    # -- headers and bodies ------------------------------------------------------------
    def headers(self, request_id: str) -> dict[str, str]:
        return probe_headers(request_id, self._api_key)

    def body(self, prompt: str | None, messages: list[dict[str, Any]] | None, max_tokens: int | None,
             stream: bool, probe: bool = False, model: str | None = None,
             tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
        return request_body(self.options, model or self.model, prompt, messages, max_tokens,
                            stream=stream, continuous_usage=self.continuous_usage,
                            ignore_eos=self.ignore_eos and not probe, tools=tools)  # fmt: skip

    # -- probes ------------------------------------------------------------------------
    def ensure_ready(self, pool: urllib3.PoolManager) -> None:
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            try:
                if self.probing:
                    self._probe(pool)
            except TRANSPORT_ERRORS as exc:
                # answered, but a probe did not end within its bound: requests would not either
                if transport_kind(exc, True) == TIMEOUT and self.cannot_start is not None:
                    self.cannot_start(f"probing {self.base_url}: {root_cause(exc)}")  # stops
                else:
                    log.warning("llmload: probing %s failed (%s); sending requests anyway",
                                self.base_url, type(exc).__name__)  # fmt: skip
            self._ready = True
            if self.report_probes is not None:  # even none: it says this worker is ready
                self.report_probes(list(self.probes))  # to the master's manifest

    def _note_probe(self, probe: ProbeRecord) -> None:
        """List a probe for the manifest (every probe, whatever its outcome)."""
        self.probes.append(dataclasses.asdict(probe))

    def _probe_json(self, pool: urllib3.PoolManager, purpose: str, method: str, url: str,
                    body: dict[str, Any] | None = None) -> tuple[int, Any]:  # fmt: skip
        """One probe exchange, noted whatever its outcome; I/O errors are re-raised."""
        sent = send_probe(pool, purpose, method, url, body=body, api_key=self.options.api_key(),
                          timeout=PROBE_TIMEOUT_S, worker_id=self.worker_id,
                          secrets=self._secrets)  # fmt: skip
        self._note_probe(sent.record)
        reply = sent.reply
        if reply.error is not None:
            raise reply.error
        assert reply.status is not None
        return reply.status, reply.json()

    def _post(
        self, pool: urllib3.PoolManager, body: dict[str, Any], purpose: str
    ) -> tuple[int, Any]:
        return self._probe_json(pool, purpose, "POST", self.url, body)

    def _probe(self, pool: urllib3.PoolManager) -> None:
        if self.model is None:
            status, doc = self._probe_json(pool, "models", "GET", self.base_url + "/v1/models")
            served = served_models(doc) if status == 200 else []
            self.model = served[0] if served else None
            log.info("llmload: model %s (from /v1/models)", self.model)
        tiny = self.prompts.text(4, random.Random(1))
        if self.options.ignore_eos == "auto":
            body = self.body(tiny, None, 2, stream=False, probe=True)
            body["ignore_eos"] = True
            status, _ = self._post(pool, body, "ignore_eos")
            self.ignore_eos = status == 200
            log.info(
                "llmload: ignore_eos %s (probe: HTTP %d)",
                "on" if self.ignore_eos else "off",
                status,
            )
        if (self.options.continuous_usage == "auto" and self.options.stream
                and self.options.endpoint in ("chat", "completions")):  # fmt: skip
            # on only if the server really puts usage in every event (some ignore the field)
            body = self.body(tiny, None, 4, stream=True, probe=True)
            body["stream_options"]["continuous_usage_stats"] = True
            rec, probe = send_stream_probe(
                pool, "continuous_usage", self.url, body, self.limits,
                endpoint=self.options.endpoint, model=self.model,
                api_key=self.options.api_key(), worker_id=self.worker_id, secrets=self._secrets,
            )  # fmt: skip
            self._note_probe(probe)
            if rec.error_kind in TIMEOUT_KINDS:
                raise TimeoutError(f"the streamed probe failed: {probe.outcome}")
            self.continuous_usage = rec.status == "ok" and rec.output_tokens_source == "usage"
            log.info("llmload: continuous usage %s (probe: HTTP %s, token counts from %s)",
                     "on" if self.continuous_usage else "off", rec.http_status,
                     rec.output_tokens_source)  # fmt: skip

        def prompt_tokens(text: str) -> int | None:
            body = self.body(text, None, 1, stream=False, probe=True)
            status, doc = self._post(pool, body, "calibration")
            usage = (doc.get("usage") if isinstance(doc, dict) else None) or {}
            value = usage.get("prompt_tokens", usage.get("input_tokens")) if status == 200 else None
            return value if isinstance(value, int) else None

        calibration = self.prompts.calibrate(prompt_tokens)
        log.info("llmload: prompt calibration %s", calibration)
