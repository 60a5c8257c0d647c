"""The simulator process: listening socket, engine task, graceful shutdown."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import signal
import sys
import time
from typing import TextIO

from analysis.kernel.errors import UsageError
from infra.simserver.api import SimApp
from infra.simserver.config import SimConfig
from infra.simserver.engine import Engine, Speculation
from infra.simserver.gpus import SimGpus
from infra.simserver.http import HttpConnection, stamp_arrivals
from infra.simserver.metrics import SimStats
from infra.simserver.prefix_cache import PrefixCache
from infra.simserver.tracing import Endpoint, SpanExporter, SpanStats, start_up_record
from infra.simserver.truth import TruthLog


class SimServer:
    """One simulated engine behind one listening socket. Start and stop it on one loop."""

    def __init__(self, config: SimConfig) -> None:
        self._created_unix_ns = time.time_ns()  # the start-up span begins here
        config.check()
        self.config = config
        self.stats = SimStats()
        if config.gpus.count:
            self.stats.gpus = SimGpus(config.gpus, time.monotonic)
        cache = None
        if config.prefix_cache.enabled:
            cache = PrefixCache(config.prefix_cache.block_size, config.prefix_cache_tokens)
        speculation = None
        if config.spec_draft_tokens:  # its own random stream: the others draw as before
            speculation = Speculation(config.spec_draft_tokens, config.spec_acceptance,
                                      random.Random(f"{config.seed}:speculation"))  # fmt: skip
        self.engine = Engine(config.profile, self.stats, config.time_scale, cache, speculation)
        self.truth: TruthLog | None = None
        self.tracer: SpanExporter | None = None
        self.app: SimApp | None = None
        self.port = 0
        self._server: asyncio.Server | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._connections: set[HttpConnection] = set()

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    async def start(self) -> None:
        config = self.config
        if config.truth_log is not None:
            try:
                self.truth = TruthLog(config.truth_log)
            except OSError as exc:
                raise UsageError(
                    f"cannot open --truth-log {config.truth_log} ({exc.strerror}); "
                    "give a file in a writable folder"
                ) from exc
        if config.otlp_traces_endpoint is not None:
            self.stats.spans = SpanStats()
            self.tracer = SpanExporter(
                Endpoint.parse(config.otlp_traces_endpoint),
                config.otlp_service_name,
                self.stats.spans,
            )
        app = SimApp(config, self.engine, self.stats, self.truth, self.tracer)
        self.app = app
        loop = asyncio.get_running_loop()
        connections = self._connections
        try:
            self._server = await loop.create_server(
                lambda: HttpConnection(app.handle, connections),
                config.host,
                config.port,
                backlog=4096,
                reuse_address=True,
            )
        except OSError as exc:
            if self.truth is not None:
                self.truth.close()
            reason = exc.strerror or str(exc)
            raise UsageError(
                f"cannot listen on {config.host}:{config.port} ({reason}); choose another "
                "--port (0: any free one) or a --host address of this machine"
            ) from exc
        for sock in self._server.sockets:
            stamp_arrivals(sock)  # the truth log's kernel arrival of a first request
        self.port = self._server.sockets[0].getsockname()[1]
        self._engine_task = asyncio.create_task(self.engine.run(), name="llmload-sim-engine")
        if self.tracer is not None:
            self.tracer.start()
            self.tracer.add(
                start_up_record(self._created_unix_ns, config.profile.name, config.served_model)
            )

    async def shutdown(self, drain_seconds: float | None = None) -> None:
        """Stop accepting, let running requests finish for up to `drain_seconds`, then
        cancel what is left, close every connection, flush the truth log and export the
        spans still queued."""
        drain = self.config.drain_seconds if drain_seconds is None else drain_seconds
        if self._server is not None:
            self._server.close()
        if self.app is not None:
            self.app.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain
        while not self.engine.idle and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self._connections):
            conn.close()
        self.engine.stop()
        if self._engine_task is not None:
            await self._engine_task
        # Let connection_lost callbacks (cancellations, truth lines) run before closing.
        for _ in range(3):
            await asyncio.sleep(0)
        for conn in list(self._connections):
            conn.abort()
        await asyncio.sleep(0)
        if self._server is not None:
            await self._server.wait_closed()
        if self.truth is not None:
            self.truth.close()
        if self.tracer is not None:
            await self.tracer.close()


def _write_port_file(path: os.PathLike[str], port: int) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def serve(config: SimConfig, out: TextIO = sys.stdout) -> int:
    """Run until SIGTERM or SIGINT, then shut down cleanly; returns the exit status (0)."""

    async def main() -> None:
        server = SimServer(config)
        await server.start()
        # The reference server must not stall its own reads: its start-up heap (imports,
        # numpy, the tokenizer) out of every later collection keeps full garbage collections
        # short (measured: 30-50 ms pauses before, which delayed reading requests and showed
        # as client error against the truth log; docs/benchmarks.md).
        gc.collect()
        gc.freeze()
        if config.port_file is not None:
            try:
                _write_port_file(config.port_file, server.port)
            except OSError as exc:
                await server.shutdown(drain_seconds=0)
                raise UsageError(
                    f"cannot write --port-file {config.port_file} ({exc.strerror}); "
                    "give a file in a writable folder"
                ) from exc
        print(
            f"llmload sim: listening on {server.url} (simulated; profile "
            f"{config.profile.name}; model {config.served_model})",
            file=out,
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await server.shutdown()

    asyncio.run(main())
    return 0
