"""Memory of one llmload Locust process per concurrent stream, against the simulated engine.

For each N in --streams, starts `llmload sim` (profile tiny, pinned to one core, paced so
that every stream stays open: one decode step of --decode-ms per token, output long enough
to outlast the ramp) and ONE headless Locust process (local runner, pinned to the other
core) running `--steps 1,N`. Once a second it samples the Locust process's RSS
(/proc/<pid>/status VmRSS), its open file descriptors, and the simulator's /metrics
(running sequences, generation tokens, finished requests). Then:

- baseline: the median RSS over the seconds of the 1-user step (one stream open, every
  code path warm);
- at N: the median RSS over the seconds in which the simulator runs exactly N sequences and
  no request has finished since the baseline (so no finished request's record is held);
- memory per stream = (RSS at N - baseline) / (N - 1); the tokens each open stream had
  received at that point (mean) are printed with it, since each request keeps its chunk
  offsets until it ends; the RSS range over the window (it rises with the tokens and falls
  when a collection frees garbage) goes with it.

The Locust process gets its soft RLIMIT_NOFILE raised to the hard limit; an N the hard limit
cannot hold (N + 256) is skipped and said so. The run of each N stops once enough samples
are in (--samples), or at --step-timeout; every process started is stopped.

--tracemalloc: start the Locust process under tracemalloc (25 frames) and print the
allocation sites that grew most between the baseline and N (a slower, separate run).

    .venv/bin/python bench/bench_memory.py [--streams 128,1024,4096] [--decode-ms 250]

Simulated engine: these figures describe llmload's client, not inference performance.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from locustfiles.options.rules import SPAWN_RATE  # noqa: E402
from tests.support.chat import BIN, LOCUSTFILE, start_sim  # noqa: E402

LIMIT_MARGIN = 256  # descriptors beyond one socket per stream (files, pipes, the spool)
SETTLE_S = 2  # seconds with all N open left out before the window
TARGET_KB = 100.0  # issue 25: under 100 kB per stream

# run under tracemalloc: SIGUSR1 dumps a snapshot to $LLMLOAD_SNAPSHOT.<n>
_TRACED_MAIN = """
import itertools, os, signal, sys, tracemalloc
from locust.main import main
count = itertools.count()
def dump(*_):
    tracemalloc.take_snapshot().dump(f"{os.environ['LLMLOAD_SNAPSHOT']}.{next(count)}")
signal.signal(signal.SIGUSR1, dump)
sys.argv[0] = "locust"
sys.exit(main())
"""


@dataclass
class Sample:
    """One second of the run: the Locust process and the simulator, side by side."""

    t: float  # s since the Locust process started
    rss_kb: int
    rss_anon_kb: int
    fds: int
    sockets: int
    running: int | None
    generated: float | None
    finished: float | None


@dataclass
class Result:
    streams: int
    baseline_kb: float
    at_n_kb: float
    samples_at_n: int
    fds: int
    sockets: int
    tokens_per_stream: float
    at_n_min_kb: int  # RSS rises with tokens and falls at collections within the window
    at_n_max_kb: int

    @property
    def per_stream_kb(self) -> float:
        return (self.at_n_kb - self.baseline_kb) / (self.streams - 1)


def proc_status(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of `pid` in kB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    return int(fields["VmRSS"].split()[0]), int(fields["RssAnon"].split()[0])


def open_fds(pid: int) -> tuple[int, int]:
    """(open descriptors, of which sockets) of `pid`."""
    fd_dir = Path(f"/proc/{pid}/fd")
    fds = sockets = 0
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed while listed
            continue
        fds += 1
        sockets += target.startswith("socket:")
    return fds, sockets


def sim_metrics(url: str) -> dict[str, float]:
    """The simulator's running sequences, generation tokens and finished requests (summed
    over labels); an unanswered scrape gives an empty dict."""
    wanted = {
        "vllm:num_requests_running": "running",
        "vllm:generation_tokens_total": "generated",
        "vllm:request_success_total": "finished",
    }
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_:]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if match and match.group(1) in wanted:
            key = wanted[match.group(1)]
            out[key] = out.get(key, 0.0) + float(match.group(2))
    return out


def raise_nofile() -> None:
    """In the Locust child: soft RLIMIT_NOFILE up to the hard limit, then its own core."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[-1]})


def measure(n: int, args: argparse.Namespace, work: Path) -> tuple[Result, list[Sample]]:
    """One simulator, one Locust process at `--steps 1,n`; the samples and the result."""
    ramp_s = n / SPAWN_RATE
    # every stream (the 1-user step's too) must outlast: its step, the ramp, the window
    stream_s = args.baseline_s + ramp_s * 1.5 + args.samples + 20
    tokens = math.ceil(stream_s * 1000 / args.decode_ms)
    sim_args = ["--decode-base-ms", str(args.decode_ms), "--decode-per-seq-us", "0",
                "--decode-per-kv-token-ns", "0", "--max-num-seqs", str(n + 64),
                "--max-waiting", str(n + 64), "--kv-cache-tokens", str((n + 64) * (tokens + 64)),
                "--drain-seconds", "0"]  # fmt: skip
    # both steps last this long: the 1-user step's seconds, then N's window and its settling
    step_s = max(args.baseline_s, args.samples + SETTLE_S + 4)
    cores = sorted(os.sched_getaffinity(0))
    samples: list[Sample] = []
    with start_sim(work / f"sim-{n}", *sim_args) as sim:
        if len(cores) > 1:
            os.sched_setaffinity(sim.proc.pid, {cores[0]})
        locust = [str(BIN / "locust")]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if args.tracemalloc:
            locust = [sys.executable, "-X", "tracemalloc=25", "-c", _TRACED_MAIN]
            env["LLMLOAD_SNAPSHOT"] = str(work / f"snapshot-{n}")
        cmd = [*locust, "-f", str(LOCUSTFILE), "--headless", "--only-summary",
               "--host", sim.url, "--events-uri", str(work / f"runs-{n}"),
               "--spool-dir", str(work / f"spool-{n}"), "--steps", f"1,{n}",
               "--step-duration", str(step_s), "--step-warmup", "0",
               "--cold-requests", "0", "--workload", f"D(16,{tokens})",
               "--request-timeout", str(stream_s * 2)]  # fmt: skip
        log = (work / f"locust-{n}.log").open("w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=raise_nofile, text=True)  # fmt: skip
        start = time.monotonic()
        baseline_finished: float | None = None
        snapshots = 0
        try:
            while proc.poll() is None and time.monotonic() - start < args.step_timeout:
                next_tick = time.monotonic() + 1.0
                rss, anon = proc_status(proc.pid)
                fds, sockets = open_fds(proc.pid)
                m = sim_metrics(sim.url)
                running = int(m["running"]) if "running" in m else None
                sample = Sample(time.monotonic() - start, rss, anon, fds, sockets, running,
                                m.get("generated"), m.get("finished"))  # fmt: skip
                samples.append(sample)
                if running == 1:
                    baseline_finished = sample.finished
                    warm = sum(s.running == 1 for s in samples) >= 3  # the step's third second
                    if args.tracemalloc and snapshots == 0 and warm:
                        proc.send_signal(signal.SIGUSR1)
                        snapshots = 1
                at_n = at_n_samples(samples, n, baseline_finished)
                if args.tracemalloc and snapshots == 1 and at_n:
                    proc.send_signal(signal.SIGUSR1)
                    snapshots = 2
                if len(at_n) >= args.samples:
                    if args.tracemalloc:  # the last snapshot, written before Locust stops
                        proc.send_signal(signal.SIGUSR1)
                        last = Path(f"{env['LLMLOAD_SNAPSHOT']}.2")
                        for _ in range(300):
                            if last.exists():
                                break
                            time.sleep(0.1)
                    break
                time.sleep(max(0.0, next_tick - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # Locust stops its users, writes its events
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            log.close()
    one = [s for s in samples if s.running == 1]
    # not the seconds in which the next step's connections were already opening
    baseline = [s.rss_kb for s in one if s.sockets <= min(x.sockets for x in one) + 2]
    at_n = at_n_samples(samples, n, baseline_finished)
    if len(baseline) < 2 or not at_n:
        tail = (work / f"locust-{n}.log").read_text()[-3000:]
        raise SystemExit(
            f"N={n}: {len(baseline)} baseline samples, {len(at_n)} at N; locust said:\n{tail}"
        )
    probes = next(s.generated for s in samples if s.running == 1) or 0.0  # before the step
    result = Result(
        streams=n,
        baseline_kb=statistics.median(baseline[1:]),  # the first second may still be warming
        at_n_kb=statistics.median(s.rss_kb for s in at_n),
        samples_at_n=len(at_n),
        fds=max(s.fds for s in at_n),
        sockets=max(s.sockets for s in at_n),
        tokens_per_stream=statistics.median((s.generated - probes) / n for s in at_n),  # type: ignore[operator]
        at_n_min_kb=min(s.rss_kb for s in at_n),
        at_n_max_kb=max(s.rss_kb for s in at_n),
    )
    if args.tracemalloc:
        first, last = at_n[0].generated, at_n[-1].generated
        print_growth(work / f"snapshot-{n}", n, 0, 1, "since the 1-user step")
        tokens = (last - first) / n if first is not None and last is not None else 0.0
        print_growth(work / f"snapshot-{n}", n, 1, 2, f"over ~{tokens:.0f} more tokens per stream")
    return result, samples


def at_n_samples(samples: list[Sample], n: int, baseline_finished: float | None) -> list[Sample]:
    """The seconds with all n streams open and none finished since the baseline, from the
    SETTLE_S-th such second on (the last streams' first reads are still arriving before)."""
    if baseline_finished is None:
        return []
    return [s for s in samples if s.running == n and s.finished == baseline_finished][SETTLE_S:]


def print_growth(prefix: Path, n: int, a: int, b: int, what: str, top: int = 12) -> None:
    """The allocation sites that grew most between tracemalloc snapshots `a` and `b`."""
    import tracemalloc

    first, second = Path(f"{prefix}.{a}"), Path(f"{prefix}.{b}")
    for _ in range(100):  # the dump may still be written
        if first.exists() and second.exists():
            break
        time.sleep(0.1)
    if not (first.exists() and second.exists()):
        print(f"tracemalloc: no snapshots {a} and {b} for N={n}")
        return
    time.sleep(1.0)
    base = tracemalloc.Snapshot.load(str(first))
    later = tracemalloc.Snapshot.load(str(second))
    stats = later.compare_to(base, "traceback")
    total = sum(s.size_diff for s in stats)
    print(f"\ntracemalloc, N={n}, {what}: traced Python memory grew {total / 1024:,.0f} kB "
          f"({total / (n - 1) / 1024:.1f} kB per stream); largest sites (leaf <- llmload's frame):")  # fmt: skip
    for stat in stats[:top]:
        leaf = stat.traceback[-1]
        ours = next(
            (
                f
                for f in reversed(stat.traceback)
                if str(ROOT) in f.filename and "/.venv/" not in f.filename
            ),
            None,
        )
        via = (
            f"  <- {Path(ours.filename).relative_to(ROOT)}:{ours.lineno}"
            if ours and ours is not leaf
            else ""
        )
        print(f"  {stat.size_diff / (n - 1):8.0f} B/stream  {stat.count_diff / (n - 1):6.1f} "
              f"blocks/stream  {leaf.filename}:{leaf.lineno}{via}")  # fmt: skip
    by_file = later.compare_to(base, "filename")
    print("  by file:")
    for stat in by_file[:top]:
        print(f"  {stat.size_diff / (n - 1):8.0f} B/stream  {stat.traceback[0].filename}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="128,1024,4096", help="concurrent streams, comma-separated")  # fmt: skip
    parser.add_argument("--decode-ms", type=float, default=250.0, help="simulator decode step (ms per token)")  # fmt: skip
    parser.add_argument("--baseline-s", type=float, default=6.0, help="seconds of the 1-user step")  # fmt: skip
    parser.add_argument("--samples", type=int, default=6, help="seconds sampled with all N open")  # fmt: skip
    parser.add_argument("--step-timeout", type=float, default=120.0, help="seconds one N may take")  # fmt: skip
    parser.add_argument("--tracemalloc", action="store_true", help="print the sites that grew (slower)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="print the per-second samples")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmload-bench-memory-"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"date: {datetime.date.today()}  machine: {platform.node()} {os.cpu_count()} cores, "
          f"python {platform.python_version()}; RLIMIT_NOFILE soft {soft}, hard {hard} "
          f"(the Locust process gets soft = hard)")  # fmt: skip
    print(f"command: {' '.join(sys.argv)}")
    results: list[Result] = []
    for n in (int(x) for x in args.streams.split(",")):
        if hard != resource.RLIM_INFINITY and n + LIMIT_MARGIN > hard:
            print(f"N={n}: skipped, the hard RLIMIT_NOFILE {hard} holds at most "
                  f"{hard - LIMIT_MARGIN} streams")  # fmt: skip
            continue
        began = time.monotonic()
        result, samples = measure(n, args, work)
        results.append(result)
        print(f"N={n}: {time.monotonic() - began:.0f} s, {result.samples_at_n} s sampled at N")
        if args.keep:
            for s in samples:
                print(f"  t={s.t:5.1f} rss={s.rss_kb / 1024:7.1f} MB anon={s.rss_anon_kb / 1024:7.1f} "
                      f"fds={s.fds:5d} running={s.running} generated={s.generated} finished={s.finished}")  # fmt: skip
    print()
    print("| streams | RSS baseline (1 stream) MB | RSS at N MB (min-max) | kB per stream | tokens "
          "per stream at N | fds at N (sockets) | under 100 kB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.streams:,} | {r.baseline_kb / 1024:.1f} | {r.at_n_kb / 1024:.1f} "
              f"({r.at_n_min_kb / 1024:.1f}-{r.at_n_max_kb / 1024:.1f}) | "
              f"{r.per_stream_kb:.1f} | {r.tokens_per_stream:.0f} | {r.fds:,} "
              f"({r.sockets:,}) | {'yes' if r.per_stream_kb < TARGET_KB else 'no'} |")  # fmt: skip
    print(f"(simulated engine: not inference performance)  logs and events under {work}")


if __name__ == "__main__":
    main()
