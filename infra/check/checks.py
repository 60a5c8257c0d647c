"""The handbook's verification before any load, in its order, against one server.

    report = run_checks(CheckConfig("http://127.0.0.1:8000"))
    report.ok, report.checks, report.learned

(0) with `wait_ready`: poll until the server first answers a completion (cold start);
(1) a non-streaming request; (2) a streaming request read to its end (usage in the stream?
`[DONE]`?); (3) an over-long prompt, which must be rejected with 400/413/422; (4) a client
cancellation: a long stream is dropped after a few tokens and the server's running-requests
gauge (Prometheus `/metrics`) must fall back to its baseline within `release_timeout`.
Along the way it learns the model id, the context length, the server version, whether the
server labels itself simulated and whether it accepts `ignore_eos`.

A check's status is `pass`, `fail` or `skip` (could not be judged: the reason says why);
`report.ok` is true when no required check failed. Failures are results, not exceptions,
except bad input: a `--model` the server refuses and does not list raises UsageError.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from analysis.kernel.prometheus import RUNNING_NAMES
from infra.check.client import Answer, StreamAnswer, Target
from infra.check.metrics import read_gauge, wait_until
from locustfiles.options.options import ENDPOINT_PATHS
from locustfiles.request.adapters import BUILTIN_ADAPTERS

INPUT_REJECTED: Final = (400, 413, 422)
DEFAULT_BAD_INPUT_WORDS: Final = 200_000
MAX_BAD_INPUT_WORDS: Final = 4_000_000  # ~8 MB of prompt: beyond that the check gives up
LONG_OUTPUT_TOKENS: Final = 4096
PROMPT: Final = "Write a short sentence about the sea."
RESULT_KIND: Final = "llmload.check"
RESULT_VERSION: Final = "1.0"


@dataclass(frozen=True)
class CheckConfig:
    url: str  # base URL, without /v1
    model: str | None = None
    also_models: tuple[str, ...] = ()  # the rest of a --model mix: each must be served too
    api_key: str | None = None
    endpoint: str = "chat"
    timeout: float = 60.0  # seconds per request (per read while streaming)
    wait_ready: bool = False
    ready_timeout: float = 600.0
    metrics_url: str | None = None  # default: <url>/metrics
    running_metric: str | None = None  # default: RUNNING_NAMES, first present
    release_timeout: float = 5.0
    cancel_after_tokens: int = 3
    bad_input_words: int | None = None  # default: max_model_len + 64, else 200,000

    @property
    def chat(self) -> bool:
        return self.endpoint == "chat"

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    @property
    def openai(self) -> bool:
        """Chat or completions (stream options, `choices`); else the Responses or Messages
        API, read by its built-in stream adapter."""
        return self.endpoint in ("chat", "completions")


@dataclass
class CheckResult:
    name: str
    status: str  # pass | fail | skip
    detail: str
    required: bool = True
    data: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False  # no answer within --timeout (the server may answer nothing)


@dataclass
class Learned:
    """What the check found out about the server (None: unknown)."""

    model: str | None = None
    max_model_len: int | None = None
    server_version: str | None = None
    server_header: str | None = None
    simulated: bool = False
    ignore_eos: str | None = None  # accepted | ignored | rejected (HTTP n) | unknown (...)
    stream_options: str | None = None  # include_usage: accepted | rejected (HTTP n)
    usage_in_stream: bool | None = None
    done_sent: bool | None = None
    running_gauge: str | None = None  # the /metrics gauge used for the cancellation check
    ready_s: float | None = None
    models_ready_s: float | None = None


@dataclass
class CheckReport:
    url: str
    checks: list[CheckResult]
    learned: Learned

    @property
    def ok(self) -> bool:
        return not any(c.required and c.status == "fail" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": RESULT_KIND,
            "schema_version": RESULT_VERSION,
            "url": self.url,
            "ok": self.ok,
            "checks": [asdict(c) for c in self.checks],
            "learned": asdict(self.learned),
        }


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.0f} ms"


def _http(answer: Answer) -> str:
    if answer.status is None:
        return answer.error or "no response"
    message = answer.error_message()
    return f"HTTP {answer.status}" + (f": {message}" if message else "")


class Checker:
    """One run of the checks against one server."""

    def __init__(self, config: CheckConfig) -> None:
        self.config = config
        self.target = Target(config.url, config.api_key, config.timeout)
        self.learned = Learned(model=config.model)
        self.metrics_url = config.metrics_url or f"{self.target.base}/metrics"
        self.gauges = (config.running_metric,) if config.running_metric else RUNNING_NAMES

    def body(self, prompt: str, max_tokens: int, stream: bool, **extra: Any) -> dict[str, Any]:
        cap = "max_output_tokens" if self.config.endpoint == "responses" else "max_tokens"
        out: dict[str, Any] = {cap: max_tokens, "stream": stream, **extra}
        if self.learned.model:
            out["model"] = self.learned.model
        if self.config.endpoint in ("chat", "messages"):
            out["messages"] = [{"role": "user", "content": prompt}]
        elif self.config.endpoint == "responses":
            out["input"] = prompt
        else:
            out["prompt"] = prompt
        return out

    # -- learning ----------------------------------------------------------------------
    def learn_models(self) -> Answer:
        answer = self.target.get("/v1/models", timeout=min(self.config.timeout, 10.0))
        learned = self.learned
        learned.server_header = answer.headers.get("server") or learned.server_header
        if answer.headers.get("x-llmload-simulated", "").lower() == "true":
            learned.simulated = True
        data = answer.body.get("data") if answer.ok and isinstance(answer.body, dict) else None
        models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        chosen = next((m for m in models if m.get("id") == self.config.model), None)
        chosen = chosen or (models[0] if models and not self.config.model else None)
        if chosen is not None:
            learned.model = self.config.model or str(chosen.get("id"))
            length = chosen.get("max_model_len")
            learned.max_model_len = length if isinstance(length, int) and length > 0 else None
        return answer

    def check_model(self, models: Answer) -> None:
        """A --model that `/v1/models` answered without listing, and that a one-token request
        is refused for (4xx), is bad input: UsageError naming the models served (as the run's
        preflight, locustfiles/master/preflight.py)."""
        if self._unlisted(models):
            self._refuse_unlisted(models, self.target.post(self.config.path, self._one_token()))
        self._check_also(models)

    def _check_also(self, models: Answer) -> None:
        """The other models of a --model mix, each as --model itself."""
        from analysis.kernel.errors import UsageError
        from locustfiles.master.preflight import unknown_model
        from locustfiles.request.errors import refused_status
        from locustfiles.run.probe import served_models

        served = served_models(models.body) if models.ok else []
        for name in self.config.also_models:
            if not served or name in served:
                continue
            answer = self.target.post(self.config.path, {**self._one_token(), "model": name})
            if refused_status(answer.status):
                raise UsageError(unknown_model(name, served, self.target.base))

    def _one_token(self) -> dict[str, Any]:
        """The one-token request for the model that tells a refused --model (and readiness)."""
        return self.body(PROMPT, 1, False)

    def _unlisted(self, models: Answer) -> list[str]:
        """The models served, when `/v1/models` answered a list without --model (else [])."""
        from locustfiles.run.probe import served_models

        model = self.config.model
        served = served_models(models.body) if models.ok else []
        return served if model and served and model not in served else []

    def _refuse_unlisted(self, models: Answer, answer: Answer) -> None:
        """UsageError when the one-token request for a --model `models` does not list was
        refused (4xx): the model is not served, and waiting will not change that."""
        from analysis.kernel.errors import UsageError
        from locustfiles.master.preflight import unknown_model
        from locustfiles.request.errors import refused_status

        served = self._unlisted(models)
        if served and self.config.model and refused_status(answer.status):
            raise UsageError(unknown_model(self.config.model, served, self.target.base))

    def learn_version(self) -> None:
        for path in ("/version", "/info"):  # vLLM and the simulator; TGI
            answer = self.target.get(path, timeout=min(self.config.timeout, 10.0))
            if answer.ok and isinstance(answer.body, dict):
                version = answer.body.get("version")
                self.learned.server_version = None if version is None else str(version)
                if answer.body.get("simulated"):
                    self.learned.simulated = True
                return

    def probe_ignore_eos(self) -> None:
        answer = self.target.post(self.config.path, self.body(PROMPT, 8, False, ignore_eos=True))
        if answer.ok:
            usage = answer.body.get("usage") if isinstance(answer.body, dict) else None
            usage = usage if isinstance(usage, dict) else {}
            tokens = usage.get("completion_tokens", usage.get("output_tokens"))
            self.learned.ignore_eos = "accepted" if tokens in (8, None) else "ignored"
        elif answer.status is not None and 400 <= answer.status < 500:
            self.learned.ignore_eos = f"rejected (HTTP {answer.status})"
        else:
            self.learned.ignore_eos = f"unknown ({_http(answer)})"

    # -- checks ------------------------------------------------------------------------
    def ready(self) -> CheckResult:
        """Poll until the first successful completion; seconds from the check's start.

        A --model the server's model list leaves out and its completion refuses (4xx) is bad
        input, not a server still loading: UsageError at once, as without --wait-ready."""
        t0 = time.monotonic()
        deadline = t0 + self.config.ready_timeout
        last = "no answer yet"
        tries = 0
        listed: Answer | None = None  # the first answer /v1/models gave with 200
        while True:
            tries += 1
            if listed is None:
                answered = self.learn_models()
                if answered.ok:
                    listed = answered
                    self.learned.models_ready_s = time.monotonic() - t0
            answer = self.target.post(self.config.path, self._one_token())
            if listed is not None:
                self._refuse_unlisted(listed, answer)
            if answer.ok:
                ready = time.monotonic() - t0
                self.learned.ready_s = ready
                if self.learned.models_ready_s is None and self.learn_models().ok:
                    self.learned.models_ready_s = time.monotonic() - t0  # came up meanwhile
                models = self.learned.models_ready_s
                more = "" if models is None else f"; /v1/models answered after {models:.2f} s"
                return CheckResult(
                    "ready", "pass", f"first completion after {ready:.2f} s ({tries} tries{more})",
                    data={"ready_s": ready, "models_ready_s": models, "tries": tries},
                )  # fmt: skip
            last = _http(answer)
            if time.monotonic() >= deadline:
                return CheckResult(
                    "ready", "fail",
                    f"no successful completion within {self.config.ready_timeout:g} s ({tries} tries; last: {last})",
                    data={"tries": tries},
                )  # fmt: skip
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def non_streaming(self) -> CheckResult:
        answer = self.target.post(self.config.path, self.body(PROMPT, 16, False))
        data: dict[str, Any] = {"http_status": answer.status, "latency_s": answer.elapsed_s}
        if not answer.ok:
            late = answer.status is None and (answer.error or "").startswith("timeout")
            return CheckResult("non-streaming", "fail", _http(answer), data=data, timed_out=late)
        try:
            if self.config.openai:
                choice = answer.body["choices"][0]
                text = (
                    (choice.get("message") or {}).get("content")
                    if self.config.chat
                    else choice.get("text")
                )
                usage = answer.body.get("usage")
                tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
            else:  # the API's own body, read by its built-in adapter
                raw = json.dumps(answer.body).encode()
                delta = BUILTIN_ADAPTERS[self.config.endpoint]().on_body(raw)
                if delta.error:
                    raise ValueError(delta.error)
                text, tokens = delta.text, delta.output_tokens
        except (TypeError, KeyError, IndexError, AttributeError, ValueError):
            return CheckResult("non-streaming", "fail", "HTTP 200 but not a completion", data=data)
        data["completion_tokens"] = tokens
        said = f"{tokens} output tokens" if tokens is not None else "no usage"
        empty = "" if text else ", empty content"
        return CheckResult(
            "non-streaming",
            "pass",
            f"HTTP 200 in {_ms(answer.elapsed_s)}, {said}{empty}",
            data=data,
        )

    def streaming(self) -> CheckResult:
        endpoint = self.config.endpoint
        if not self.config.openai:  # these APIs end their streams with the usage
            answer = self.target.stream(self.config.path, self.body(PROMPT, 32, True), endpoint)
            self.learned.stream_options = f"none ({endpoint} API)"
        else:
            options = {"stream_options": {"include_usage": True}}
            answer = self.target.stream(
                self.config.path, self.body(PROMPT, 32, True, **options), endpoint
            )
        if self.config.openai and answer.status in INPUT_REJECTED:  # options not understood
            self.learned.stream_options = f"rejected (HTTP {answer.status})"
            answer = self.target.stream(self.config.path, self.body(PROMPT, 32, True), endpoint)
        elif self.config.openai and answer.status == 200:
            self.learned.stream_options = "accepted"
        data = _stream_data(answer)
        if answer.error_kind is not None:
            detail = _stream_failure(answer)
            late = answer.error_kind == "timeout" and answer.tokens == 0
            return CheckResult("streaming", "fail", detail, data=data, timed_out=late)
        if answer.tokens == 0:
            return CheckResult(
                "streaming", "fail", "HTTP 200 but no output token arrived", data=data
            )
        self.learned.usage_in_stream = answer.usage_in_stream
        self.learned.done_sent = answer.done
        return CheckResult(
            "streaming", "pass",
            f"HTTP 200, {answer.tokens} tokens in {answer.record.events} events, TTFT {_ms(answer.ttft_s)}, "
            f"E2E {_ms(answer.e2e_s)}; usage in stream: {_yes(answer.usage_in_stream)}, [DONE]: {_yes(answer.done)}",
            data=data,
        )  # fmt: skip

    def bad_input(self) -> CheckResult:
        length = self.learned.max_model_len
        words = self.config.bad_input_words
        if words is None:
            if length is not None and length + 64 > MAX_BAD_INPUT_WORDS:
                return CheckResult(
                    "bad input", "skip",
                    f"max_model_len {length} is too long to exceed here (give --bad-input-words)",
                )  # fmt: skip
            words = length + 64 if length is not None else DEFAULT_BAD_INPUT_WORDS
        prompt = " ".join(["a"] * words)
        answer = self.target.post(self.config.path, self.body(prompt, 16, False))
        context = f"max_model_len {length}" if length else "max_model_len unknown"
        data = {"prompt_words": words, "max_model_len": length, "http_status": answer.status}
        what = f"a {words}-word prompt ({context})"
        if answer.status in INPUT_REJECTED:
            said = answer.error_message()[:80]
            detail = f"HTTP {answer.status} for {what}" + (f": {said}" if said else "")
            return CheckResult("bad input", "pass", detail, data=data)
        if answer.ok:
            return CheckResult(
                "bad input", "fail", f"HTTP 200: the server accepted {what}", data=data
            )
        return CheckResult(
            "bad input", "fail", f"{_http(answer)} for {what}; expected 400, 413 or 422", data=data
        )

    def cancellation(self) -> CheckResult:
        baseline = read_gauge(self.target, self.metrics_url, self.gauges)
        if baseline.ok:
            self.learned.running_gauge = baseline.name
        length = self.learned.max_model_len
        max_tokens = (
            LONG_OUTPUT_TOKENS if length is None else max(16, min(LONG_OUTPUT_TOKENS, length - 64))
        )
        extra = {"ignore_eos": True} if self.learned.ignore_eos == "accepted" else {}
        during: dict[str, Any] = {}

        def at_cancel_point() -> None:
            if baseline.ok:
                during["reading"] = read_gauge(self.target, self.metrics_url, self.gauges)

        n = self.config.cancel_after_tokens
        answer = self.target.stream(
            self.config.path, self.body(PROMPT, max_tokens, True, **extra), self.config.endpoint,
            cancel_after_tokens=n, on_cancel_point=at_cancel_point,
        )  # fmt: skip
        data: dict[str, Any] = {"max_tokens": max_tokens, "cancel_after_tokens": n}
        if answer.error_kind is not None:
            return CheckResult(
                "cancellation",
                "fail",
                f"the long stream failed: {_stream_failure(answer)}",
                data=data,
            )
        if not answer.cancelled:
            return CheckResult(
                "cancellation", "skip",
                f"the stream ended after {answer.tokens} tokens, before the client could cancel",
                data=data,
            )  # fmt: skip
        gone = f"disconnected after {answer.tokens} tokens"
        if not baseline.ok:
            follow = self.target.post(self.config.path, self.body(PROMPT, 4, False))
            if not follow.ok:
                return CheckResult(
                    "cancellation", "fail",
                    f"{gone}; the next request failed: {_http(follow)}", data=data,
                )  # fmt: skip
            return CheckResult(
                "cancellation", "skip",
                f"{gone}; the server still answers, but the release is not verifiable: "
                f"{baseline.error} (see --metrics-url, --running-metric)",
                data=data,
            )  # fmt: skip
        assert baseline.value is not None
        base = baseline.value
        running = during["reading"].value if "reading" in during else None
        data.update(gauge=baseline.name, baseline=base, running_during=running)
        if running is None or running <= base:
            return CheckResult(
                "cancellation", "skip",
                f"{gone}; {baseline.name} did not rise above its baseline {base:g} while the "
                f"request ran (saw {running}): not attributable",
                data=data,
            )  # fmt: skip
        seconds, last = wait_until(
            self.target, self.metrics_url, self.gauges, lambda v: v <= base,
            self.config.release_timeout,
        )  # fmt: skip
        data["release_s"] = seconds
        if seconds is None:
            return CheckResult(
                "cancellation", "fail",
                f"{gone}; {baseline.name} still {last.value} (baseline {base:g}) "
                f"{self.config.release_timeout:g} s later: the server did not free the request",
                data=data,
            )  # fmt: skip
        return CheckResult(
            "cancellation", "pass",
            f"{gone}; {baseline.name} {running:g} -> {base:g} within {_ms(seconds)}",
            data=data,
        )  # fmt: skip


def _yes(flag: bool | None) -> str:
    return "?" if flag is None else ("yes" if flag else "no")


def _stream_data(answer: StreamAnswer) -> dict[str, Any]:
    return {
        "http_status": answer.status,
        "tokens": answer.tokens,
        "events": answer.record.events,
        "ttft_s": answer.ttft_s,
        "e2e_s": answer.e2e_s,
        "usage_in_stream": answer.usage_in_stream,
        "done": answer.done,
        "finish_reason": answer.finish_reason,
        "error_kind": answer.error_kind,
    }


def _stream_failure(answer: StreamAnswer) -> str:
    if answer.error_kind == "http":
        return _http(Answer(answer.status, answer.body))
    return f"{answer.error_kind}: {answer.detail}"


def run_checks(
    config: CheckConfig, progress: Callable[[CheckResult], None] | None = None
) -> CheckReport:
    """Every check in the handbook's order; a server that cannot be reached, or that answers
    neither the non-streaming nor the streaming request within --timeout, skips the rest.
    `progress` hears each result as it comes (a check can take --timeout)."""
    checker = Checker(config)
    checks: list[CheckResult] = []
    report = CheckReport(checker.target.base, checks, checker.learned)

    def add(result: CheckResult) -> None:
        checks.append(result)
        if progress is not None:
            progress(result)

    if config.wait_ready:
        add(checker.ready())
        if checks[-1].status == "fail":
            return report
    models = checker.learn_models()
    if models.connect_failed:
        add(CheckResult("non-streaming", "fail", f"cannot reach the server: {models.error}"))
        for name in ("streaming", "bad input", "cancellation"):
            add(CheckResult(name, "skip", "server unreachable"))
        return report
    checker.check_model(models)
    checker.learn_version()
    add(checker.non_streaming())
    add(checker.streaming())
    if checks[-1].timed_out and checks[-2].timed_out:  # it answers nothing: no use waiting more
        why = f"the server answered neither request within --timeout {config.timeout:g} s"
        for name in ("bad input", "cancellation"):
            add(CheckResult(name, "skip", why))
        return report
    add(checker.bad_input())
    checker.probe_ignore_eos()
    add(checker.cancellation())
    return report
