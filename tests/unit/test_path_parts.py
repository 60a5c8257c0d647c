"""The request path's parts (analysis/derive/path.py, and `llmload sql`'s request_path view) on
one request timed by hand: each part is the time between two instants of one timeline, so a
first token that took longer to reach the client than the last one did leaves no part
negative (the tail was `E2E - TTFT - decode` before: -4 ms here, issue 36). That the SQL
view computes the same parts: tests/e2e/test_request_path.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.derive.path import E2E_PARTS, TTFT_PARTS, request_path
from analysis.kernel.spans import trace_id_of

MS = 1_000_000  # ns
SENT = 1_700_000_000_000_000_000  # the write, master's clock (ns)
# the timeline, in ms after the write
SPAN_START, SCHEDULED, FIRST_OUT, LAST_OUT = 1.0, 3.0, 10.0, 40.0
CLIENT_FIRST, CLIENT_END = 15.0, 41.0  # the first token took 5 ms to arrive, the last 1 ms


def _span(**overrides: float) -> dict[str, object]:
    span: dict[str, object] = {
        "name": "llm_request", "trace_id": trace_id_of("r1"), "server_request_id": "chatcmpl-r1",
        "start_ns": SENT + int(SPAN_START * MS),
        "queue_s": (SCHEDULED - SPAN_START - 0.5) / 1e3,  # 0.5 ms of ingress before queueing
        "prefill_s": (FIRST_OUT - SCHEDULED) / 1e3,
        "ttft_s": (FIRST_OUT - SPAN_START) / 1e3,
        "decode_s": (LAST_OUT - FIRST_OUT) / 1e3 + 0.0002,  # the engine core's own stamps
        "e2e_s": (LAST_OUT - SPAN_START) / 1e3,
    }  # fmt: skip
    span.update(overrides)
    return span


def _parts(span: dict[str, object]) -> dict[str, float]:
    requests = pd.DataFrame({"request_id": ["r1"], "client_delay_ns": [200_000],
                             "connect_new": [False], "connect_ns": [0]})  # fmt: skip
    path = request_path(requests, np.array([SENT]), np.array([CLIENT_FIRST / 1e3]),
                        np.array([CLIENT_END / 1e3]), pd.DataFrame([span]))  # fmt: skip
    assert path.span.tolist() == [True]
    return {part: float(values[0]) * 1e3 for part, values in path.parts.items()}  # ms


def test_every_part_is_a_time_between_two_instants() -> None:
    parts = _parts(_span())
    assert parts["network_up"] == pytest.approx(SPAN_START)
    assert parts["server_other"] == pytest.approx(0.5)
    assert parts["server_prefill"] == pytest.approx(FIRST_OUT - SCHEDULED)
    assert parts["first_token_delivery"] == pytest.approx(CLIENT_FIRST - FIRST_OUT)  # 5 ms
    # decode on the clock the span's TTFT and E2E are taken on, not the engine core's
    assert parts["server_decode"] == pytest.approx(LAST_OUT - FIRST_OUT)
    assert parts["tail"] == pytest.approx(CLIENT_END - LAST_OUT)  # the last token's 1 ms
    assert all(value > 0 for value in parts.values()), parts
    assert sum(parts[p] for p in TTFT_PARTS) == pytest.approx(CLIENT_FIRST)
    assert sum(parts[p] for p in E2E_PARTS) == pytest.approx(CLIENT_END)


def test_a_span_without_e2e_takes_its_decode_time() -> None:
    parts = _parts(_span(e2e_s=float("nan")))
    assert parts["server_decode"] == pytest.approx(LAST_OUT - FIRST_OUT + 0.2)
    assert parts["tail"] == pytest.approx(CLIENT_END - LAST_OUT - 0.2)
    assert sum(parts[p] for p in E2E_PARTS) == pytest.approx(CLIENT_END)


def test_a_span_without_ttft_keeps_its_decode_time() -> None:
    """As the SQL view's coalesce(e2e - ttft, decode): no TTFT, the span's own decode."""
    parts = _parts(_span(ttft_s=float("nan")))
    assert parts["server_decode"] == pytest.approx(LAST_OUT - FIRST_OUT + 0.2)
