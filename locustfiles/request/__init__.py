"""One request on the wire: the keep-alive client, the SSE reader, the stream's
record, the deadlines, and the tokenizer that counts a delta's tokens."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "Limits",
    "RequestRecord",
    "StreamFailure",
    "StreamState",
    "TokenCounter",
    "Watch",
    "events",
    "exchange",
    "execute",
    "load_tokenizer",
    "new_pool",
    "parse_body",
    "transport_kind",
]

__getattr__ = public_face(
    __name__,
    {
        "Limits": "client",
        "RequestRecord": "record",
        "StreamFailure": "stream",
        "StreamState": "stream",
        "TokenCounter": "tokenizer",
        "Watch": "watchdog",
        "events": "sse",
        "exchange": "exchange",
        "execute": "client",
        "load_tokenizer": "tokenizer",
        "new_pool": "client",
        "parse_body": "stream",
        "transport_kind": "errors",
    },
)
