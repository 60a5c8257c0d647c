"""`llmload store`: SeaweedFS on 127.0.0.1, the exports a client needs, a clean stop."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
from botocore.config import Config

ROOT = Path(__file__).parents[2]


def test_store_command_prints_exports_and_stops_cleanly(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("llmload")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(
        [exe, "store", "--dir", str(tmp_path / "data"), "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    exports: dict[str, str] = {}
    deadline = time.monotonic() + 30
    buffer = b""
    try:
        while "LLMLOAD_EVENTS_URI" not in exports:
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, "store did not print its exports"
            if select.select([proc.stdout], [], [], left)[0]:
                buffer += os.read(proc.stdout.fileno(), 4096)
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.startswith(b"export "):
                        name, _, value = line.decode()[7:].partition("=")
                        exports[name] = value
        assert set(exports) >= {
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ENDPOINT_URL_S3",
            "LLMLOAD_S3_ADDRESSING",
        }
        endpoint = exports["AWS_ENDPOINT_URL_S3"]
        assert endpoint.startswith("http://127.0.0.1:")
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )
        client.put_object(Bucket="llmload", Key="hello", Body=b"world")
        assert client.get_object(Bucket="llmload", Key="hello")["Body"].read() == b"world"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    port = int(endpoint.rsplit(":", 1)[1])
    with socket.socket() as sock:  # the store is gone: nothing listens any more
        assert sock.connect_ex(("127.0.0.1", port)) != 0
