"""Events URIs name the store a user means, relative or absolute, and refuse the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.kernel.errors import UsageError
from analysis.kernel.storage import FileStore, S3Store, join_uri, open_store


@pytest.mark.parametrize(
    ("uri", "root"),
    [("file://./runs", Path("runs")), ("file:///tmp/x", Path("/tmp/x")),
     ("file://localhost/tmp/y", Path("/tmp/y")), ("runs", Path("runs")), ("./a/b", Path("a/b"))],
)  # fmt: skip
def test_file_uris(uri: str, root: Path) -> None:
    store = open_store(uri)
    assert isinstance(store, FileStore) and store.root == root


def test_s3_uris_and_joining() -> None:
    store = open_store("s3://bucket/some/prefix?addressing=path")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.addressing) == ("bucket", "some/prefix", "path")
    assert join_uri("s3://b/p?addressing=path", "run1") == "s3://b/p/run1?addressing=path"


@pytest.mark.parametrize(
    ("uri", "message"),
    [("", "empty events URI"), ("s3://", "no bucket"), ("s3://key:secret@bucket/p", "must not carry credentials"),
     ("gs://bucket/p", "not supported"), ("s3://b/p?addressing=weird", "addressing")],
)  # fmt: skip
def test_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        open_store(uri)
