"""A RAG service of its own kind on llmload: its own request body and SSE JSON, behind a login.

    locust -f examples/rag_locustfile.py --headless --host http://rag.internal:8080 \
        --steps 1,4,16 --step-duration 60 --events-uri s3://bucket/llmload \
        --workload "D(256,128)"
    llmload report RUN_URI

The service (tests/support/services.py runs one in the tests):

- `POST /auth/login` with {"user", "password"} answers {"token": ...};
- `POST /v1/rag/ask` with `Authorization: Bearer TOKEN` and {"question", "top_k",
  "max_answer_tokens"} streams SSE events whose data is JSON: {"kind": "retrieval"} first,
  then {"kind": "token", "text": ...} per token, then {"kind": "done", "usage":
  {"question_tokens", "answer_tokens"}}.

Everything else is llmload's: the workload's prompts and lengths, steps or rates, sessions,
the rows, the live tab, the report and its verdicts (docs/extending.md).
"""

from __future__ import annotations

import json
import os

from locustfiles.chat import Ask, Delta, Http, HttpRequest, LlmUser, StreamAdapter


class RagStream(StreamAdapter):
    """One answer's events: retrieval (no output), tokens (text), done (usage, the end)."""

    def on_event(self, data: bytes) -> Delta | None:
        event = json.loads(data)
        kind = event["kind"]
        if kind == "token":
            return Delta(text=event["text"], tokens=1)  # the service streams one token per event
        if kind == "done":
            usage = event["usage"]
            return Delta(output_tokens=usage["answer_tokens"],
                         prompt_tokens=usage["question_tokens"], finish="stop")  # fmt: skip
        if kind == "error":
            return Delta(error=event.get("message", "error"))
        return None  # retrieval: the documents found, no output yet


class RagUser(LlmUser):
    endpoint = "rag"  # the requests' name in the rows, the live tab and the report

    def login(self, http: Http) -> None:
        reply = http.post("/auth/login", json={
            "user": "llmload", "password": os.environ.get("RAG_PASSWORD", ""),
        }).raise_for_status()  # fmt: skip
        self.token = reply.json()["token"]

    def build_request(self, ask: Ask) -> HttpRequest:
        body = {"question": ask.text(), "top_k": 3, "max_answer_tokens": ask.max_tokens or 64}
        return HttpRequest("/v1/rag/ask", body, {"Authorization": f"Bearer {self.token}"})

    def stream_adapter(self) -> StreamAdapter:
        return RagStream()
