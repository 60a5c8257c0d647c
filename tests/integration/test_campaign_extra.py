"""A campaign's `extra` is checked by Locust's own parser (in a child process) before a run."""

from __future__ import annotations

import pytest

from analysis.kernel.errors import UsageError
from infra.campaign.extra import check_extra


def test_flags_locust_and_llmload_know_pass() -> None:
    check_extra(("--stop-timeout", "10", "--loglevel=WARNING", "--connect-timeout", "5"), "c.yaml")
    check_extra((), "c.yaml")  # nothing to check: no child process


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--stpo-timeout", "10"), "unknown flag(s) '--stpo-timeout' (did you mean '--stop-timeout'?)"),
        (("--stop-timeout", "abc"), "is refused by Locust's parser: argument -s/--stop-timeout"),
        (("10",), "has value(s) without a flag: '10'"),
    ],
)  # fmt: skip
def test_unknown_flags_bad_values_and_stray_values_are_refused(
    extra: tuple[str, ...], message: str
) -> None:
    with pytest.raises(UsageError, match="^c.yaml: key 'extra' ") as caught:
        check_extra(extra, "c.yaml")
    assert message in str(caught.value)
