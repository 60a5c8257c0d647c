"""A raw HTTP server whose every byte the test places (`raw_server`), and SSE bytes for it.

    port = raw_server(lambda conn: conn.sendall(HEAD + chunk(sse_event("a")) + END))

It reads one request (headers, and a body of its Content-Length) and hands the connection
to `respond`; what `respond` raises fails the test at teardown.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

TIMEOUT = 10.0  # seconds, for any single socket operation of the server
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
END = b"0\r\n\r\n"  # the chunked body's last chunk

Respond = Callable[[socket.socket], None]


def sse_event(content: str, finish: str | None = None) -> bytes:
    obj = {"id": "c1", "choices": [{"index": 0, "delta": {"content": content},
                                    "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def trickle_head(conn: socket.socket) -> None:
    """Send a response head (four of them: long enough to outlast any deadline of a test) a
    byte every 0.2 s, each read of the client well under its timeout."""
    with contextlib.suppress(OSError):
        for byte in HEAD * 4:
            conn.sendall(bytes([byte]))
            time.sleep(0.2)


def reset(conn: socket.socket) -> None:
    """Drop the connection with a TCP reset (SO_LINGER 0), not a clean close."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) PEM files of a self-signed certificate for 127.0.0.1, made in
    `folder` (cryptography: a dependency of moto, in the dev extras)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    ip = x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([ip]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                         serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
    return cert_file, key_file


@pytest.fixture
def raw_server() -> Iterator[Callable[..., int]]:
    """`start(respond, tls=None)`: a server on 127.0.0.1, port 0, that reads one request and
    hands the connection to `respond`; returns the port. `tls`: a server-side SSLContext
    (https). Its errors fail the test at teardown."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def start(respond: Respond, tls: ssl.SSLContext | None = None) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(TIMEOUT)
        listeners.append(listener)

        def run() -> None:
            try:
                conn, _ = listener.accept()
                if tls is not None:
                    conn.settimeout(TIMEOUT)
                    conn = tls.wrap_socket(conn, server_side=True)
                with conn:
                    conn.settimeout(TIMEOUT)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    head, _, body = data.partition(b"\r\n\r\n")
                    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
                    length = int(
                        {k.lower(): v for k, v in fields.items()}.get(b"content-length", 0)
                    )
                    while len(body) < length:
                        body += conn.recv(65536)
                    respond(conn)
            except BaseException as exc:  # reported at teardown
                errors.append(exc)

        thread = threading.Thread(target=run, name="raw-sse-server", daemon=True)
        thread.start()
        threads.append(thread)
        return int(listener.getsockname()[1])

    yield start
    for thread in threads:
        thread.join(TIMEOUT)
    for listener in listeners:
        listener.close()
    assert not errors, errors
