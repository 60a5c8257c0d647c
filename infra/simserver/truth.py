"""Ground-truth log: one JSON line per request, written when the request ends.

Fields (docs/simserver.md): request_id, path, status, outcome, arrival_unix_ns,
kernel_arrival_unix_ns (the kernel's receive time of the request's bytes; null when unknown),
stream,
prompt_tokens, completion_tokens, cached_tokens (prompt tokens found in the prefix cache;
null when never admitted), tool_call (the answer was a tool call), finish_reason, faults,
headers_offset_ns and events, a list of [offset_ns, tokens] per SSE event written, offsets
from the moment the full request was received (time.perf_counter_ns on the server), taken
just before the bytes were handed to the socket. Lines are flushed as they are written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO


class TruthLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = path.open("a", buffering=1, encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None
