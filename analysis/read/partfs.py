"""Where a store's objects are for pyarrow: a filesystem and paths, read in place.

    filesystem, paths = locate(store, ["chunks/worker=w1/part-000000.parquet"])
    pq.read_metadata(filesystem.open_input_file(paths[0]))      # the footer only

Local stores are local files; S3 stores are pyarrow's S3 filesystem with the credentials,
endpoint, region and addressing boto3 resolves for llmload's own client, so what the sink
wrote is what is read, in ranged reads (a footer, a column chunk), never a whole object.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from analysis.kernel.errors import UsageError
from analysis.kernel.schema import check_version, version_of
from analysis.kernel.storage import FileStore, ObjectStore, S3Store


def s3_filesystem(store: S3Store) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem with what boto3 resolves for `store` (credentials, endpoint,
    region, addressing), so the engine reads what the store writes."""
    import boto3

    client = store.client
    creds = boto3.session.Session().get_credentials()  # the chain S3Store's client used
    frozen = creds.get_frozen_credentials() if creds is not None else None
    endpoint = client.meta.endpoint_url or ""
    scheme, _, host = endpoint.partition("://")
    options: dict[str, Any] = {
        "region": client.meta.region_name or "us-east-1",
        "endpoint_override": host or None,
        "scheme": scheme or "https",
        "force_virtual_addressing": store.addressing == "virtual",
    }
    if frozen is not None:
        options.update(access_key=frozen.access_key, secret_key=frozen.secret_key,
                       session_token=frozen.token)  # fmt: skip
    else:
        options["anonymous"] = True
    return pafs.S3FileSystem(**options)


def locate(store: ObjectStore, keys: list[str]) -> tuple[pafs.FileSystem, list[str]]:
    """The filesystem and paths of a store's keys."""
    if isinstance(store, FileStore):
        root = store.root.absolute()
        return pafs.LocalFileSystem(), [str(root / key) for key in keys]
    if isinstance(store, S3Store):
        prefix = f"{store.bucket}/{store.prefix}".rstrip("/")
        return s3_filesystem(store), [f"{prefix}/{key}" for key in keys]
    raise UsageError(f"cannot query the events store {store!r} in place")


def footer_rows(filesystem: pafs.FileSystem, path: str, where: str) -> int:
    """A part's row count from its footer alone (a ranged read), its schema version checked:
    SchemaVersionError for a version this llmload cannot read, Arrow/OS errors for a file
    that is not Parquet."""
    with filesystem.open_input_file(path) as file:
        meta = pq.read_metadata(file)
    check_version(version_of(meta.schema.to_arrow_schema()), where=where)
    return int(meta.num_rows)
