"""Object storage behind one URI: `s3://bucket/prefix`, `file:///path` or a plain path.

    store = open_store("s3://bench/runs")      # keys are relative to the prefix
    store.put("r1/manifest.json", data)         # never overwrites unless overwrite=True
    store.get("r1/manifest.json"); store.list("r1/requests/")

S3 uses boto3's standard credential chain. Endpoints for MinIO, SeaweedFS, Ceph or R2 come
from `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` (read by boto3 itself); path-style addressing
with `LLMLOAD_S3_ADDRESSING=path` or `?addressing=path` on the URI. The boto3 client is made
lazily in the process that uses it (and again after a fork), never at import time.
Credentials are never part of the URI, the store's repr, or any error message.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from analysis.kernel.errors import LlmloadError, UsageError


class StorageError(LlmloadError):
    """A store operation failed (after the store's own retries)."""


class ObjectExistsError(StorageError):
    """A put without overwrite found the key already taken."""


class ObjectMissingError(StorageError):
    """A get found no object under the key."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the store's prefix
    size: int


class ObjectStore(Protocol):
    uri: str

    def put(self, key: str, data: bytes, *, overwrite: bool = False) -> None: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...


def join_uri(uri: str, *parts: str) -> str:
    """`join_uri("s3://b/p", "run1")` → `s3://b/p/run1` (query string kept at the end)."""
    base, sep, query = uri.partition("?")
    joined = "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])
    return joined + (sep + query if sep else "")


def expand_home(path: str, what: str) -> str:
    """A local path with a leading `~` or `~user` made the home folder it names (as a shell
    does, for paths a shell did not expand: quoted, `--flag=~/x`, env vars, config files).
    UsageError naming `what` when it names no home (an unknown user)."""
    if not path.startswith("~"):
        return path
    expanded = os.path.expanduser(path)
    if expanded.startswith("~"):
        user = path.split("/", 1)[0]
        raise UsageError(
            f"{what} {path}: {user} names no home folder (no such user); "
            "give an absolute path or ~/..."
        )
    return expanded


def open_store(uri: str) -> ObjectStore:
    """The store a URI names. Raises UsageError for a URI llmload cannot use."""
    if not uri or not uri.strip():
        raise UsageError("empty events URI; give s3://bucket/prefix, file:///path or a path")
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise UsageError(f"events URI {uri!r} has no bucket; use s3://bucket/prefix")
        if parsed.username or parsed.password:
            raise UsageError(
                "events URI must not carry credentials; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or another boto3 credential source) instead"
            )
        addressing = parse_qs(parsed.query).get("addressing", [""])[0] or os.environ.get(
            "LLMLOAD_S3_ADDRESSING", ""
        )
        if addressing not in ("", "path", "virtual", "auto"):
            raise UsageError(f"S3 addressing {addressing!r} is unknown; use path, virtual or auto")
        return S3Store(parsed.netloc, parsed.path.strip("/"), addressing or None)
    if parsed.scheme == "file":
        # file:///abs/path, file://localhost/abs/path; file://./rel is a relative path;
        # file://~/runs is the home folder's (not a folder named "~")
        host = "" if parsed.netloc in ("", "localhost") else parsed.netloc
        return FileStore(Path(expand_home(host + parsed.path, "events URI")))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter would be a Windows drive
        raise UsageError(
            f"events URI scheme {parsed.scheme!r} is not supported; "
            "use s3://bucket/prefix, file:///path or a plain path"
        )
    return FileStore(Path(expand_home(uri, "events URI")))


def _clean_key(key: str) -> str:
    key = key.strip("/")
    if not key or any(part in ("", ".", "..") for part in key.split("/")):
        raise UsageError(f"object key {key!r} is not a plain relative key")
    return key


class FileStore:
    """A directory as an object store; puts are atomic (temp file, then link/rename)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = root.resolve().as_uri() if root.is_absolute() else str(root)

    def __repr__(self) -> str:
        return f"FileStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / _clean_key(key)

    def put(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path)  # atomic, fails when the key exists
                except FileExistsError as exc:
                    raise ObjectExistsError(f"{key} already exists in {self.uri}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise ObjectMissingError(f"no object {key} in {self.uri}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        if not base.exists():
            return []
        out = []
        for path in base.rglob("*"):
            if path.is_file() and not path.name.startswith(".tmp-"):
                rel = path.relative_to(self.root).as_posix()
                if rel.startswith(prefix.lstrip("/")):
                    out.append(ObjectInfo(rel, path.stat().st_size))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


_NO_CREDENTIALS = "no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
_BAD_CREDENTIALS = "credentials refused: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
_NO_ENDPOINT = "store unreachable: check AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) and the network"
# What an S3 error code most likely means for a user, and what to change.
_S3_HINTS = {
    "NoCredentialsError": _NO_CREDENTIALS,
    "PartialCredentialsError": _NO_CREDENTIALS,
    "EndpointConnectionError": _NO_ENDPOINT,
    "ConnectTimeoutError": _NO_ENDPOINT,
    "InvalidAccessKeyId": _BAD_CREDENTIALS,
    "SignatureDoesNotMatch": _BAD_CREDENTIALS,
    "AccessDenied": "access denied: give credentials allowed to use bucket {bucket}",
    "403": "forbidden: check the credentials and their access to bucket {bucket}",
    "NoSuchBucket": "bucket {bucket} does not exist: create it or fix the events URI",
}


class S3Store:
    """An S3-compatible bucket and prefix, through boto3."""

    def __init__(self, bucket: str, prefix: str, addressing: str | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.addressing = addressing
        self.uri = f"s3://{bucket}/{prefix}".rstrip("/")
        self._client: Any = None
        self._pid = -1
        self._conditional_puts = True

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r})"

    @property
    def client(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            import boto3
            from botocore.config import Config

            s3_opts = {"addressing_style": self.addressing} if self.addressing else {}
            config = Config(
                s3=s3_opts,
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
            )
            self._client = boto3.session.Session().client("s3", config=config)
            self._pid = os.getpid()
        return self._client

    def _key(self, key: str) -> str:
        key = _clean_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, action: str, key: str, exc: Exception) -> StorageError:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        hint = _S3_HINTS.get(str(code), "").format(bucket=self.bucket)
        hint = f" ({hint})" if hint else ""
        return StorageError(f"S3 {action} of {key} in {self.uri} failed: {code}{hint}")

    def put(self, key: str, data: bytes, *, overwrite: bool = False) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(key)
        try:
            if overwrite:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
                return
            if self._conditional_puts:
                try:
                    self.client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
                    return
                except ClientError as exc:
                    code = exc.response.get("Error", {}).get("Code", "")
                    if code in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
                        raise ObjectExistsError(f"{key} already exists in {self.uri}") from exc
                    if code not in ("NotImplemented", "501"):
                        raise
                    self._conditional_puts = False  # store ignores If-None-Match: check first
            if self.exists(key):
                raise ObjectExistsError(f"{key} already exists in {self.uri}")
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("put", key, exc) from exc

    def get(self, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            return bytes(body.read())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ObjectMissingError(f"no object {key} in {self.uri}") from exc
            raise self._fail("get", key, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("get", key, exc) from exc

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail("head", key, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("head", key, exc) from exc

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        from botocore.exceptions import BotoCoreError, ClientError

        base = f"{self.prefix}/" if self.prefix else ""
        full = base + prefix.lstrip("/")
        out = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(ObjectInfo(obj["Key"][len(base) :], int(obj["Size"])))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("list", prefix or "/", exc) from exc
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("delete", key, exc) from exc
