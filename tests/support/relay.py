"""A TCP relay that adds latency (and, on request, resets) to a link: netem where there is none.

    python -m tests.support.relay --listen 10.213.77.2:8000 --to 127.0.0.1:8001 \
        --delay-ms 5 --jitter-ms 1 [--reset-rate 0.01] [--seed 0]

Every chunk read on either side is written to the other DELAY ± JITTER ms after it arrived
(uniform jitter), never before the chunk before it (the byte stream keeps its order), so a
request and each of its response's chunks travel one added delay each way: a round trip of
about 2 x DELAY, like a link with that one-way latency. With `--reset-rate R`, each request
(a chunk from the client) dooms its connection with probability R: after a random number
of further response chunks (0 to 20) the client's side is reset (RST, SO_LINGER 0), as on a
flaky link; clients reconnect. Stops on SIGTERM/SIGINT.

Used by the multi-host tests (tests/multihost/), inside the target's network namespace: the
kernel here has no `netem` qdisc.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import socket
import struct
import time

_CHUNK = 65536


class Link:
    def __init__(self, target: tuple[str, int], delay_s: float, jitter_s: float,
                 reset_rate: float, rng: random.Random) -> None:  # fmt: skip
        self.target = target
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.reset_rate = reset_rate
        self.rng = rng

    def _delay(self) -> float:
        return max(0.0, self.delay_s + self.rng.uniform(-self.jitter_s, self.jitter_s))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        fate = _Fate()  # a request (a chunk from the client) may doom its connection
        tasks = [
            asyncio.ensure_future(self._pump(reader, up_writer, fate, request_side=True)),
            asyncio.ensure_future(self._pump(up_reader, writer, fate, request_side=False)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(self.delay_s + self.jitter_s)  # what is in flight arrives
        for task in tasks:
            task.cancel()
        for w in (writer, up_writer):
            with contextlib.suppress(Exception):
                w.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, fate: _Fate,
                    request_side: bool) -> None:  # fmt: skip
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(queue, dst, None if request_side else fate))
        try:
            while True:
                data = await src.read(_CHUNK)
                if (
                    request_side
                    and data
                    and fate.left is None
                    and self.rng.random() < self.reset_rate
                ):
                    fate.left = self.rng.randint(0, 20)  # response chunks before the reset
                due = time.monotonic() + self._delay()
                await queue.put((due, data))
                if not data:
                    break
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes]], dst: asyncio.StreamWriter,
                    fate: _Fate | None) -> None:  # fmt: skip
        last = 0.0
        while True:
            due, data = await queue.get()
            due = max(due, last)
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            last = due
            if not data:
                with contextlib.suppress(Exception):
                    dst.write_eof()
                return
            if fate is not None and fate.left is not None:
                if fate.left <= 0:
                    _reset(dst)
                    return
                fate.left -= 1
            dst.write(data)
            with contextlib.suppress(ConnectionError, OSError):
                await dst.drain()


class _Fate:
    """A connection's fate: None, or the response chunks it has left before its reset."""

    left: int | None = None


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0): the peer sees 'connection reset'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def serve(listen: tuple[str, int], link: Link) -> None:
    server = await asyncio.start_server(link.handle, *listen, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, type=_address)
    parser.add_argument("--to", required=True, type=_address)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--reset-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    link = Link(args.to, args.delay_ms / 1000, args.jitter_ms / 1000, args.reset_rate,
                random.Random(args.seed))  # fmt: skip
    asyncio.run(serve(args.listen, link))


if __name__ == "__main__":
    main()
