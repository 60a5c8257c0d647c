"""`both_sse_readers`: a test runs on the C decoder (where built) and on sse.py's Python code."""

from __future__ import annotations

import pytest

from locustfiles.request import sse


@pytest.fixture(params=["native", "python"])
def both_sse_readers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The SSE reader of this run of the test: "native" or "python" (sse._native hidden)."""
    if request.param == "python":
        monkeypatch.setattr(sse, "_native", None)
    elif sse._native is None:
        pytest.skip("the C extension is not built")
    return str(request.param)
