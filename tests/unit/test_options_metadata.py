"""`--metadata JSON`: run facts that land as top-level keys of the manifest config."""

from __future__ import annotations

import argparse

import pytest

from analysis.kernel.errors import UsageError
from locustfiles.options.options import OPTIONS, from_parsed, parse_metadata


def _namespace(**overrides: object) -> argparse.Namespace:
    values = {flag.lstrip("-").replace("-", "_"): kw.get("default") for flag, kw in OPTIONS}
    return argparse.Namespace(**{**values, **overrides})


def test_metadata_lands_in_the_config_top_level() -> None:
    options = from_parsed(_namespace(metadata='{"hardware": "1x H100", "revision": "abc"}'))
    config = options.config()
    assert config["hardware"] == "1x H100" and config["revision"] == "abc"
    assert "metadata" not in config


def test_without_metadata_the_config_is_unchanged() -> None:
    config = from_parsed(_namespace()).config()
    assert "metadata" not in config and "hardware" not in config


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{", "--metadata is not valid JSON"),
        ("[1]", "--metadata must be a JSON object"),
        ('{"seed": 1}', "--metadata key 'seed' is an option's name"),
    ],
)
def test_bad_metadata_is_one_line(text: str, expected: str) -> None:
    with pytest.raises(UsageError, match=expected):
        parse_metadata(text)
