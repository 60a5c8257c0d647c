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
    "execute",
    "load_tokenizer",
    "new_pool",
    "parse_body",
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
        "execute": "client",
        "load_tokenizer": "tokenizer",
        "new_pool": "client",
        "parse_body": "stream",
    },
)
