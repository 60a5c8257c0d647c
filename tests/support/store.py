"""A real S3 server for tests: SeaweedFS (`weed mini`) on free 127.0.0.1 ports.

    def test_x(s3_target):                 # a fresh bucket; AWS_* env set via monkeypatch
        store = open_store(s3_target.uri)  # s3://<bucket>/events
        ...
    def test_y(own_seaweed):               # a store of its own, free to stop and restart

One SeaweedFS serves the whole session (~1 s to start); each test gets its own bucket.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.store import LocalStore

TEST_ACCESS_KEY = "LLMLOADTESTACCESSKEY"


@dataclass
class S3Target:
    local: LocalStore
    bucket: str
    uri: str  # s3://<bucket>/events

    @property
    def env(self) -> dict[str, str]:
        return self.local.env()

    def client(self) -> Any:
        return self.local.client()

    def objects(self) -> dict[str, bytes]:
        """Every object in the bucket, by key, with its bytes."""
        client = self.client()
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"]
                out[obj["Key"]] = body.read()
        return out


def _new_store(root: Path) -> LocalStore:
    secret = f"test-secret-{uuid.uuid4().hex}"
    return LocalStore(root, access_key=TEST_ACCESS_KEY, secret_key=secret, environ={})


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStore]:
    """One SeaweedFS for the session."""
    with _new_store(tmp_path_factory.mktemp("seaweed")) as store:
        yield store


@pytest.fixture
def s3_target(seaweed: LocalStore, monkeypatch: pytest.MonkeyPatch) -> S3Target:
    """A fresh bucket on the session's SeaweedFS, with the client environment set."""
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    seaweed.create_bucket(bucket)
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return S3Target(seaweed, bucket, f"s3://{bucket}/events")


@pytest.fixture
def own_seaweed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Target]:
    """A SeaweedFS of this test's own (stop/start it freely), environment set."""
    with _new_store(tmp_path / "seaweed") as store:
        for name, value in store.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        yield S3Target(store, store.bucket, f"s3://{store.bucket}/events")
