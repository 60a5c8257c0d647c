"""The hooks of a service: what a user's own locustfile overrides to load-test any LLM service
(docs/extending.md). `chat.LlmUser` implements them for the built-in endpoints; a subclass
overrides what differs:

    class RagUser(LlmUser):
        endpoint = "rag"
        def login(self, http: Http) -> None:
            reply = http.post("/login", json={"user": "load"}).raise_for_status()
            self.token = reply.json()["token"]
        def build_request(self, ask: Ask) -> HttpRequest:
            return HttpRequest("/ask", {"question": ask.text(), "max_tokens": ask.max_tokens},
                               {"Authorization": f"Bearer {self.token}"})
        def stream_adapter(self) -> StreamAdapter:
            return RagStream()

The worker calls them: `login` once per user before its first request (again after a login
that failed), `build_request` and `stream_adapter` once per request. They run on the worker's
event loop, between other requests' reads: none may block (the `Http` helper's calls yield to
the loop; time.sleep, a blocking socket or a long computation stall every request of the
worker, and the worker's self-monitor flags those requests). `build_request` and the adapter
keep no per-request state on the user: in open loop (`--rates`) one user object sends many
arrivals, one after another, and a session's turns share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import urllib3

from locustfiles.request.adapters import StreamAdapter
from locustfiles.request.exchange import HttpStatusError, Reply, exchange

__all__ = ["Ask", "HookFailed", "Http", "HttpRequest", "HttpStatusError", "Reply", "Service",
           "join_url", "prepare"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Ask:
    """What llmload asks of one request: the input of `build_request`.

    prompt: the prompt's text, or None when the request is chat messages (a session's turn,
    a dataset of messages): then `messages`, in OpenAI chat's shape. max_tokens: the output
    cap (None: none). prompt_tokens: the length the workload asked for (None: a dataset's
    text). model: the model to ask for (None: the service's default). tools: the tools a
    session's turn offers (`--tool-rate`), in OpenAI chat's shape, else None. session_id and
    turn: the session and turn index (None outside sessions). request_id: llmload's id of the
    request (also sent as X-Request-Id and in traceparent)."""

    request_id: str
    prompt: str | None
    messages: list[dict[str, Any]] | None
    max_tokens: int | None
    model: str | None
    stream: bool
    scenario: str
    prompt_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    session_id: str | None = None
    turn: int | None = None

    def text(self) -> str:
        """The prompt as one text: the prompt, or the messages' contents joined by new lines."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(str(m.get("content") or "") for m in self.messages or [])


@dataclass(slots=True)
class HttpRequest:
    """What to send: a path on the target (or a whole http(s) URL), the body (a JSON object,
    or bytes sent as they are: give their Content-Type in the headers), and headers (over
    llmload's: X-Request-Id, traceparent and the API key's Authorization when --api-key-env
    names one). Always a POST."""

    path: str
    body: dict[str, Any] | bytes
    headers: dict[str, str] = field(default_factory=dict)

    def url(self, base_url: str) -> str:
        """Where it goes: `path` on `base_url`, or `path` itself when it is a whole URL."""
        return join_url(base_url, self.path)


def join_url(base_url: str, path: str) -> str:
    """`path` on the target's base URL, or `path` itself when it is a whole http(s) URL."""
    return path if path.startswith(("http://", "https://")) else base_url.rstrip("/") + path


class Http:
    """A small HTTP client on the user's own connection pool for the `login` hook: each call
    sends one request and reads its whole reply (`Reply`: status, data, headers, json()), and
    yields to the worker's loop while it waits. Transport failures come back on the reply
    (`reply.error`); `reply.raise_for_status()` raises for them and for a non-2xx status."""

    def __init__(self, pool: urllib3.PoolManager, base_url: str, timeout: float) -> None:
        self._pool = pool
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def url(self, path: str) -> str:
        return join_url(self.base_url, path)

    def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return exchange(self._pool, "GET", self.url(path), None, headers, self.timeout)

    def post(self, path: str, json: dict[str, Any] | None = None,
             headers: dict[str, str] | None = None) -> Reply:  # fmt: skip
        return exchange(self._pool, "POST", self.url(path), json if json is not None else {},
                        headers, self.timeout)  # fmt: skip


class Service:
    """The hooks (a base of `chat.LlmUser`); see the module's docstring.

    endpoint: the name the rows, Locust's statistics and the report give this service's
    requests (the built-in: --endpoint's)."""

    endpoint: ClassVar[str | None] = None
    _llmload_logged_in = False  # the login hook succeeded (set on the instance)

    def login(self, http: Http) -> None:
        """A per-user start-up step (fetch a token, open a session); by default none."""

    def build_request(self, ask: Ask) -> HttpRequest:
        """What to send for `ask`."""
        raise NotImplementedError

    def stream_adapter(self) -> StreamAdapter | None:
        """A fresh adapter to read one response (None: OpenAI chat or completions)."""
        return None

    def endpoint_name(self) -> str | None:
        """The requests' name (the rows' `endpoint`): `endpoint`, else the class's name in
        lower case; None: the built-in --endpoint's."""
        return type(self).endpoint or type(self).__name__.lower()


class HookFailed(Exception):
    """A service's hook raised (`prepare`): which hook, and what it raised (`error`)."""

    def __init__(self, owner: str, hook: str, error: Exception) -> None:
        super().__init__(f"{owner}.{hook}")
        self.owner = owner
        self.hook = hook
        self.error = error


def prepare(service: Service, pool: urllib3.PoolManager, base_url: str, login_timeout: float,
            ask: Ask) -> tuple[HttpRequest, StreamAdapter | None]:  # fmt: skip
    """One request by a service's hooks: its login (once per service; again after one that
    raised), what to send and the adapter that reads it. A hook that raises is HookFailed,
    naming the hook and what it raised; the worker and the preflight each say it their
    way. GreenletExit (the run stopping) passes through as it is."""
    owner = type(service).__name__
    hook = "login"
    try:
        if not service._llmload_logged_in:
            service.login(Http(pool, base_url, login_timeout))
            service._llmload_logged_in = True
        hook = "build_request"
        request = service.build_request(ask)
        hook = "stream_adapter"
        return request, service.stream_adapter()
    except Exception as exc:
        raise HookFailed(owner, hook, exc) from exc
