"""Every request is accounted for: a bug in llmload becomes a `client_error` row that the sink
keeps, and every HTTP status has a kind of its own."""

from __future__ import annotations

import pytest
import urllib3

from analysis.schema import ERROR_KINDS
from locustfiles.request.client import Limits, classify_status, execute
from locustfiles.request.record import RequestRecord
from locustfiles.request.tokenizer import TokenCounter
from locustfiles.sink.encode import EncodeContext, encode_requests
from tests.support.sim import SimFactory


def _broken_encode(text: str) -> list[int]:
    raise RuntimeError("tokenizer blew up")


def test_a_bug_while_reading_is_recorded_as_client_error_and_kept(sim_factory: SimFactory) -> None:
    sim = sim_factory()
    pool = urllib3.PoolManager(retries=False)
    model = sim.config.served_model
    record = RequestRecord("req-client-error", 0, 1, False, "D(8,8)", "chat", model, True, 8, 8, "")
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"X-Request-Id": record.request_id}
    url = f"http://127.0.0.1:{sim.port}/v1/chat/completions"
    counter = TokenCounter(_broken_encode, "broken")
    execute(pool, url, body, headers, record, Limits(request_timeout=10.0), counter)
    assert record.http_status == 200
    assert record.status == "error" and record.error_kind == "client_error"
    assert record.error_detail and "RuntimeError: tokenizer blew up" in record.error_detail
    # The row goes through the sink's encoder unharmed: kept, not rejected.
    result = encode_requests([record.row()], EncodeContext("run-1", "w1"))
    assert result.rejected == 0 and result.errors == []
    assert result.table.column("error_kind").to_pylist() == ["client_error"]
    assert result.table.column("request_id").to_pylist() == ["req-client-error"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (100, "http_unexpected_status"),
        (201, "http_unexpected_status"),
        (204, "http_unexpected_status"),
        (299, "http_unexpected_status"),
        (301, "http_3xx"),
        (307, "http_3xx"),
        (399, "http_3xx"),
        (400, "http_4xx_input"),
        (413, "http_4xx_input"),
        (422, "http_4xx_input"),
        (401, "http_4xx_other"),
        (404, "http_4xx_other"),
        (499, "http_4xx_other"),
        (429, "queue_rejected"),
        (503, "queue_rejected"),
        (500, "http_5xx"),
        (502, "http_5xx"),
        (599, "http_5xx"),
        (600, "http_unexpected_status"),
    ],
)
def test_every_status_class_has_its_kind(status: int, kind: str) -> None:
    assert classify_status(status) == kind
    assert kind in ERROR_KINDS


def test_no_non_200_status_falls_outside_the_schema() -> None:
    kinds = {classify_status(s) for s in range(100, 600) if s != 200}
    assert kinds <= set(ERROR_KINDS)
    assert "http_5xx" not in {classify_status(s) for s in range(200, 400) if s != 200}
