"""A plain `/generate` endpoint streaming raw text lines, on llmload.

    locust -f examples/generate_locustfile.py --headless --host http://127.0.0.1:9000 \
        --rates 2,4,8 --step-duration 60 --events-uri ./runs --tokenizer gpt2
    llmload report ./runs/RUN_ID

The service takes {"prompt", "max_new_tokens"} and answers with a `text/plain` body, one
token per line, that ends when the answer does. The stream adapter reads lines
(`framing = "lines"`): each line is one event, the body's end is the answer's end. The
service counts no tokens: llmload counts them with `--tokenizer` (else one per line).
"""

from __future__ import annotations

from locustfiles.chat import Ask, Delta, HttpRequest, LlmUser, StreamAdapter


class Lines(StreamAdapter):
    framing = "lines"

    def on_event(self, data: bytes) -> Delta | None:
        return Delta(text=data.decode() + "\n")

    def on_end(self) -> Delta:
        return Delta(finish="stop")  # the body's end is the answer's end


class GenerateUser(LlmUser):
    endpoint = "generate"

    def build_request(self, ask: Ask) -> HttpRequest:
        return HttpRequest(
            "/generate", {"prompt": ask.text(), "max_new_tokens": ask.max_tokens or 64}
        )

    def stream_adapter(self) -> StreamAdapter:
        return Lines()
