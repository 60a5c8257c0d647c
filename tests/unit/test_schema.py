"""Event schema v1: versioning, part keys, and docs/events.md in step with the code."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from analysis.kernel.errors import SchemaVersionError
from analysis.kernel.layout import part_key
from analysis.kernel.schema import (
    CHUNKS_SCHEMA,
    ERROR_KINDS,
    REQUESTS_SCHEMA,
    SAMPLES_SCHEMA,
    SCHEMA_VERSION,
    STALLS_SCHEMA,
    check_version,
    version_of,
)

DOC = Path(__file__).parents[2] / "docs" / "events.md"


def documented_columns(section: str) -> list[str]:
    text = DOC.read_text()
    body = text.split(f"## `{section}`", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([a-z_0-9]+)` \|", body, flags=re.MULTILINE)


@pytest.mark.parametrize(
    ("section", "schema"),
    [
        ("requests", REQUESTS_SCHEMA),
        ("chunks", CHUNKS_SCHEMA),
        ("samples", SAMPLES_SCHEMA),
        ("stalls", STALLS_SCHEMA),
    ],
)
def test_docs_list_exactly_the_schema_columns(section: str, schema: pa.Schema) -> None:
    assert documented_columns(section) == schema.names


def test_every_part_schema_carries_the_version() -> None:
    for schema in (REQUESTS_SCHEMA, CHUNKS_SCHEMA, SAMPLES_SCHEMA, STALLS_SCHEMA):
        assert version_of(schema) == SCHEMA_VERSION
        assert (
            version_of(
                pa.table(
                    {
                        n: pa.array([], type=f.type)
                        for n, f in zip(schema.names, schema, strict=True)
                    },
                    schema=schema,
                ).schema
            )
            == SCHEMA_VERSION
        )


def test_readers_accept_known_major_and_refuse_others() -> None:
    assert check_version("1.0") == "1.0"
    assert check_version(b"1.7") == "1.7"
    with pytest.raises(SchemaVersionError, match="2.0 is not supported.*upgrade llmload"):
        check_version("2.0")
    with pytest.raises(SchemaVersionError, match="no llmload schema version"):
        check_version(None)


def test_part_keys_follow_the_documented_layout() -> None:
    assert part_key("chunks", "w1", 7) == "chunks/worker=w1/part-000007.parquet"
    with pytest.raises(ValueError, match="unknown table"):
        part_key("tokens", "w1", 0)


def test_docs_list_exactly_the_error_kinds() -> None:
    text = DOC.read_text()
    body = text.split("### Error kinds (`error_kind`)", 1)[1].split("\n#", 1)[0]
    documented = re.findall(r"^\| `([a-z_0-9]+)` \|", body, flags=re.MULTILINE)
    assert sorted(documented) == sorted(ERROR_KINDS)
    assert {"client_error", "http_3xx", "http_unexpected_status"} <= set(ERROR_KINDS)
