"""The target's base URL (`--host`, `llmload check URL`, a campaign's `target.url`), the keys
`--extra-body` may not set, and the preflight's word on a model the server does not list."""

from __future__ import annotations

import pytest

from analysis.kernel.errors import UsageError
from infra.campaign.config import parse_campaign
from locustfiles.master.preflight import unknown_model
from locustfiles.options.options import from_parsed
from locustfiles.options.parsers import BODY_OWNERS, base_url_problem, check_extra_body, check_host
from locustfiles.request.errors import refused_status
from locustfiles.run.probe import served_models
from tests.support.options import parsed_options as _parsed


@pytest.mark.parametrize(
    ("url", "base"),
    [("http://h:8000", "http://h:8000"), ("http://h:8000/", "http://h:8000"),
     ("https://api.example.com", "https://api.example.com"),
     ("http://[::1]:8000/", "http://[::1]:8000")],
)  # fmt: skip
def test_a_base_url_passes_without_its_trailing_slash(url: str, base: str) -> None:
    assert base_url_problem(url) is None
    assert check_host(url) == base


@pytest.mark.parametrize(
    ("url", "message"),
    [("http://h:8000/v1", "--host http://h:8000/v1 has a path: give the server's base URL "
      "without /v1 (llmload adds /v1/chat/completions): --host http://h:8000"),
     ("http://h:8000/v1/", "without /v1 (llmload adds /v1/chat/completions): --host http://h:8000"),
     ("http://h:8000/v1/chat/completions", "without /v1"),
     ("https://u:p@h/v1/models", ": --host https://u:p@h"),
     ("http://h:8000/proxy/llm", "has a path: give the server's base URL without one (llmload "
      "adds /v1/chat/completions; a server behind a path prefix must be reachable at the root "
      "of a host or port): --host http://h:8000"),
     ("http://h:8000?key=1", "has a query: give the server's base URL without one"),
     ("http://h:8000/#x", "has a query"),
     ("h:8000", "--host h:8000 is not an http(s) URL: give the server's base URL, e.g. --host "
      "http://127.0.0.1:8000"),
     ("ftp://h", "is not an http(s) URL"),
     ("http://h:99999", "has an invalid port")],
)  # fmt: skip
def test_a_url_with_a_path_or_query_is_refused_with_the_base_url(url: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        check_host(url)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_refusal_names_the_endpoint_llmload_adds() -> None:
    found = base_url_problem("http://h/v1", "/v1/completions")
    assert found is not None and "(llmload adds /v1/completions)" in found[0]


def test_a_campaign_target_url_is_refused_as_host_is() -> None:
    with pytest.raises(UsageError, match=r"^c.yaml: key 'target.url' has a path: give the "
                       r"server's base URL without /v1 .*url: 'http://h:8000', not "
                       r"'http://h:8000/v1'$"):  # fmt: skip
        parse_campaign({"target": {"url": "http://h:8000/v1"}, "workload": "D(8,4)"}, "c.yaml")
    ok = parse_campaign({"target": {"url": "http://h:8000/"}, "workload": "D(8,4)"}, "c.yaml")
    assert ok.target.url == "http://h:8000"


@pytest.mark.parametrize("key", sorted(BODY_OWNERS))
def test_extra_body_may_not_set_what_llmload_owns(key: str) -> None:
    with pytest.raises(UsageError, match=rf"^--extra-body sets '{key}', which llmload owns"):
        check_extra_body({"temperature": 0, key: None})


def test_extra_body_is_checked_when_the_options_are_parsed() -> None:
    message = ("--extra-body sets 'stream_options', which llmload owns (--continuous-usage "
               "decides it); leave it out of --extra-body")  # fmt: skip
    with pytest.raises(UsageError) as caught:
        from_parsed(_parsed(extra_body='{"stream_options": null}'))
    assert str(caught.value) == message
    body = '{"temperature": 0, "top_p": 0.9, "ignore_eos": false}'
    assert from_parsed(_parsed(extra_body=body)).extra_body["top_p"] == 0.9


def test_the_owned_keys_are_the_request_builders() -> None:
    assert set(BODY_OWNERS) == {"model", "messages", "prompt", "max_tokens",
                                "max_completion_tokens", "stream", "stream_options", "n",
                                "input", "instructions", "system", "max_output_tokens"}  # fmt: skip


def test_served_models_and_the_refusal_naming_them() -> None:
    doc = {"object": "list", "data": [{"id": "a"}, {"id": "b"}, {"object": "model"}, "x"]}
    assert served_models(doc) == ["a", "b"]
    assert served_models({"data": []}) == served_models(None) == served_models([1]) == []
    assert unknown_model("m", ["a", "b"], "http://h:8000") == (
        "--model 'm' is not served by http://h:8000: it serves 'a', 'b'; give one of them "
        "(e.g. --model a) or leave --model out for the first"
    )
    many = unknown_model("m", [f"m{i}" for i in range(12)], "http://h")
    assert "'m9', ...;" in many and "'m10'" not in many
    assert [s for s in (None, 200, 400, 404, 408, 422, 429, 500) if refused_status(s)] == [
        400, 404, 422,
    ]  # fmt: skip
