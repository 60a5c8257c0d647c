"""Soak: a long run at the highest load the workers sustain below 80% CPU; is memory flat?

Everything on 127.0.0.1: the local SeaweedFS store (infra.store.LocalStore), the simulated
engine (`llmload sim`, profile tiny: 1 ms decode steps, so the workers, not the engine, are
the limit), a Locust master and 2 worker processes (infra.campaign, as `llmload campaign`
starts them).

1. Load. Without `--concurrency`, a calibration run first (the same processes): one step
   per level of `--calibrate` (total users over both workers), `--calibrate-step` seconds
   each. The soak's load is the highest level at which the report flags no worker as
   saturated: every worker's one-second CPU% stayed below 80% (`worker_cpu_max_pct`) and
   its event-loop lag p99 below 5 ms (`loop_lag_p99_ms`). The second half matters where the
   workers share cores with the engine and the store (2 cores here): a worker is starved,
   its loop running late, before its own CPU reaches 80%. No level passing: the lowest.
   With `--concurrency N` that fixed load is used and calibration is skipped.
2. Soak: one step at that concurrency for `--duration` seconds (default 600). Every 5 s the
   RSS and CPU% of every process (master, each worker, sim, weed) are sampled with psutil.
3. At the end: the report (`analysis.build_report`), then per process its start-up RSS (the
   largest sample of the first `--startup` seconds, default 60, at most half the run: a
   worker's RSS saws with its 10 s part seals, and the peak is the level to compare with),
   the largest RSS after start-up, the last one, and their growth over the start-up RSS.
   "flat" when no process grew beyond start-up + 10%. Then requests, errors by kind, the
   report's completeness and its worker warnings. The samples go to `soak-samples.csv` next
   to the report.

    make soak                                         # calibration, then 10 minutes
    .venv/bin/python bench/soak.py --duration 60      # a short trial
    .venv/bin/python bench/soak.py --concurrency 16   # a fixed load, no calibration

Every loop ends by itself: the run is bounded by the campaign's deadline, the sampler by the
master's exit (or that deadline), and every process started here is stopped on the way out,
Ctrl-C included. The store's data is deleted at the end (`--keep-store` keeps it); logs and
reports stay in the work folder printed at the start. Simulated engine: these figures
describe llmload, not inference.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import math
import os
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.derive.workers import SATURATED_LAG_MS  # noqa: E402
from analysis.kernel.schema import SATURATED_CPU_PERCENT  # noqa: E402
from infra.campaign import Campaign, RunResult, Target, parse_campaign, run_campaign  # noqa: E402
from infra.campaign.procs import Children, shielded, sigterm_interrupts  # noqa: E402
from infra.campaign.runner import run_deadline  # noqa: E402
from infra.store import LocalStore  # noqa: E402

WORKERS = 2
SIM_PROFILE = "tiny"
# The simulator's LRU prefix cache is bounded by its KV budget (16M tokens in `tiny`): it
# would take ~10 minutes to fill and look like a leak. 64k tokens fill during start-up.
SIM_PREFIX_CACHE_TOKENS = 65536
WORKLOAD = "0.7*D(128,64)+0.3*U(256,1024)/(32,128)"  # the demo's mix
SAMPLE_EVERY_S = 5.0
FLAT_GROWTH = 0.10  # "flat": no process above its start-up RSS + 10%
SIM_START_TIMEOUT_S = 20.0
MIB = 1024 * 1024


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the soak run started
    process: str  # master, worker-1, worker-2, sim, weed
    pid: int
    rss_bytes: int
    cpu_pct: float  # % of one core since the previous sample of this process


@dataclass(frozen=True)
class Growth:
    process: str
    startup_rss: int
    max_rss: int
    end_rss: int
    cpu_mean: float
    cpu_max: float

    @property
    def max_growth(self) -> float:
        return self.max_rss / self.startup_rss - 1.0

    @property
    def end_growth(self) -> float:
        return self.end_rss / self.startup_rss - 1.0


class Sampler(threading.Thread):
    """Every `interval` s: RSS and CPU% of this process's descendants, named by role.

    Ends when stopped, when the Locust master it has seen is gone, or at `deadline_s`.
    """

    def __init__(self, interval: float, deadline_s: float) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.interval, self.deadline_s = interval, deadline_s
        self.samples: list[Sample] = []
        self._halt = threading.Event()
        self._seen_master = False
        self._procs: dict[int, tuple[str, psutil.Process]] = {}
        self._workers = 0
        self._start = time.monotonic()

    def stop(self) -> None:
        self._halt.set()
        self.join(self.interval + 5)

    def run(self) -> None:
        self._refresh()  # primes cpu_percent: its first reading is meaningless
        while not self._halt.wait(self.interval):
            t = time.monotonic() - self._start
            if t > self.deadline_s or not self._tick(t):
                return

    def _tick(self, t: float) -> bool:
        """One round of samples; False once the master has ended."""
        self._refresh()
        master_alive = False
        for pid, (name, proc) in list(self._procs.items()):
            try:
                with proc.oneshot():
                    sample = Sample(t, name, pid, proc.memory_info().rss, proc.cpu_percent())
            except psutil.Error:  # ended since the refresh
                del self._procs[pid]
                continue
            self.samples.append(sample)
            master_alive |= name == "master"
        self._seen_master |= master_alive
        return master_alive or not self._seen_master

    def _refresh(self) -> None:
        for proc in sorted(psutil.Process().children(recursive=True), key=lambda p: p.pid):
            if proc.pid in self._procs:
                continue
            with contextlib.suppress(psutil.Error):
                name = self._role(proc.cmdline())
                if name is not None:
                    proc.cpu_percent()
                    self._procs[proc.pid] = (name, proc)

    def _role(self, cmd: list[str]) -> str | None:
        if cmd and Path(cmd[0]).name == "weed":
            return "weed"
        if "--master" in cmd:
            return "master"
        if "--worker" in cmd:
            self._workers += 1
            return f"worker-{self._workers}"
        if "infra" in cmd and "sim" in cmd:
            return "sim"
        return None


def main() -> int:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmload-soak-"))
    print(
        f"soak: {args.duration:g} s, {WORKERS} workers, sim profile {SIM_PROFILE}, "
        f"workload {WORKLOAD}; work folder {work}\n"
        f"machine: {platform.node()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        flush=True,
    )
    store = LocalStore(work / "store", environ={})
    try:
        with sigterm_interrupts(), store, Children(work / "logs") as sim:
            url = start_sim(sim, work)
            base = replace(
                soak_campaign(args, 1),
                target=Target(url=url),
                events_uri=store.events_uri("runs"),
                extra=("--spool-dir", str(work / "spool")),
            )
            level = args.concurrency or calibrate(args, base, store, work)
            result, sampler = soak(args, base, level, store, work)
    finally:
        with shielded():
            if not args.keep_store:
                shutil.rmtree(work / "store", ignore_errors=True)
    startup_s = min(args.startup, args.duration / 2)
    print_results(result, sampler.samples, startup_s, work)
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="soak seconds (600)")
    parser.add_argument(
        "--concurrency", type=int, default=0,
        help="total users over both workers; 0 (default): calibrate first",
    )  # fmt: skip
    parser.add_argument(
        "--calibrate", default="4,8,16,32,48,64",
        help="calibration levels, total users (default 4,8,16,32,48,64)",
    )  # fmt: skip
    parser.add_argument("--calibrate-step", type=float, default=10.0, help="seconds per level")
    parser.add_argument(
        "--startup", type=float, default=60.0,
        help="seconds after which start-up counts as done (60; at most half of --duration)",
    )  # fmt: skip
    parser.add_argument("--keep-store", action="store_true", help="keep the store's data")
    args = parser.parse_args()
    if not (args.duration > 0 and args.calibrate_step > 0 and args.startup > 0):
        parser.error("--duration, --calibrate-step and --startup must be > 0")
    if args.concurrency < 0:
        parser.error("--concurrency must be >= 0")
    try:
        args.levels = tuple(sorted({int(x) for x in args.calibrate.split(",")}))
    except ValueError:
        parser.error(f"--calibrate {args.calibrate!r}: give users per level, e.g. 4,8,16")
    if args.levels[0] < 1:
        parser.error("--calibrate levels must be >= 1 user")
    return args


def soak_campaign(args: argparse.Namespace, level: int) -> Campaign:
    """The soak's campaign (target and store filled in by the caller)."""
    return parse_campaign(
        {
            "name": "soak",
            "target": {"url": "http://127.0.0.1:8000"},  # replaced by the simulator's
            "workload": [{"name": "mixed", "spec": WORKLOAD}],
            "steps": [level],
            "step_duration": args.duration,
            "step_warmup": min(10.0, args.duration / 4),
            "events_uri": "s3://llmload/runs",  # replaced by the store's
            "workers": WORKERS,
            "worker_wait": 60,
            "engine": {
                "model_full_name": f"llmload-sim-{SIM_PROFILE} (simulated)",
                "hardware": f"none: simulated engine (llmload sim --profile {SIM_PROFILE})",
            },
        },
        source="bench/soak.py",
    )


def start_sim(children: Children, work: Path) -> str:
    port_file = work / "sim.port"
    cmd = [sys.executable, "-m", "infra", "sim", "--port", "0", "--port-file", str(port_file),
           "--profile", SIM_PROFILE, "--prefix-cache-tokens", str(SIM_PREFIX_CACHE_TOKENS)]  # fmt: skip
    proc = children.start("sim", cmd, {**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + SIM_START_TIMEOUT_S
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the simulator did not start: {children.log_tail('sim')}")
        time.sleep(0.05)
    return f"http://127.0.0.1:{int(port_file.read_text().strip())}"


def calibrate(args: argparse.Namespace, base: Campaign, store: LocalStore, work: Path) -> int:
    """The highest level at which no worker was saturated (else the lowest level).

    Saturated as the report flags it: CPU max >= 80% or loop-lag p99 >= 5 ms. On a machine
    whose cores the workers share with the engine and the store, a worker is starved (its
    loop runs late) before its own CPU reaches 80%: such a load is not sustained either.
    """
    levels = args.levels
    campaign = replace(
        base,
        name="soak-calibration",
        steps=levels,
        step_duration=args.calibrate_step,
        step_warmup=min(3.0, args.calibrate_step / 3),
        cold_requests=0,
    )
    print(f"calibration: levels {levels}, {args.calibrate_step:g} s each", flush=True)
    (result,) = run_campaign(campaign, work / "calibration", env=store.env(), echo=_echo)
    print(
        "| users | worker CPU max % | loop-lag p99 ms | output tokens/s | requests/s | sustained |"
    )
    print("|---|---|---|---|---|---|")
    passing = []
    for row in result.report.step_rows:
        cpu, lag = row.get("worker_cpu_max_pct"), row.get("loop_lag_p99_ms")
        ok = _below(cpu, SATURATED_CPU_PERCENT) and _below(lag, SATURATED_LAG_MS)
        print(
            f"| {row['concurrency']} | {_num(cpu, 0)} | {_num(lag, 2)} "
            f"| {_num(row.get('output_tokens_per_s'), 0)} | {_num(row.get('requests_per_s'), 1)} "
            f"| {'yes' if ok else 'no'} |"
        )
        if ok:
            passing.append(int(row["concurrency"]))
    limits = f"CPU < {SATURATED_CPU_PERCENT:g}% and loop-lag p99 < {SATURATED_LAG_MS:g} ms"
    if passing:
        level = max(passing)
        why = f"the highest level with every worker at {limits}"
    else:
        level = levels[0]
        why = f"no level kept every worker at {limits}: the lowest"
    if level == levels[-1] and passing:
        why += " (the highest level tried: the machine or the engine limits, not the workers)"
    print(f"calibration: soak at {level} users, {why}", flush=True)
    return level


def soak(
    args: argparse.Namespace, base: Campaign, level: int, store: LocalStore, work: Path
) -> tuple[RunResult, Sampler]:
    campaign = replace(base, steps=(level,))
    print(f"soak: {level} users for {args.duration:g} s", flush=True)
    sampler = Sampler(SAMPLE_EVERY_S, run_deadline(campaign))
    sampler.start()
    try:
        (result,) = run_campaign(campaign, work / "reports", env=store.env(), echo=_echo)
    finally:
        sampler.stop()
    return result, sampler


def growth(samples: list[Sample], startup_s: float) -> list[Growth]:
    """Per process: start-up RSS, the max after start-up, the last RSS; CPU% after start-up.

    The start-up RSS is the largest sample of the first `startup_s` seconds: a worker's RSS
    saws with its part seals (every 10 s), so one sample may catch a trough; the sawtooth's
    peak is the level a later sample must not exceed by more than FLAT_GROWTH.
    """
    out = []
    for name in sorted({s.process for s in samples}, key=_process_order):
        mine = [s for s in samples if s.process == name]
        before = [s for s in mine if s.t_s <= startup_s]
        after = [s for s in mine if s.t_s > startup_s]
        if not (before and after):
            continue  # started after, or ended before, start-up was done
        cpu = [s.cpu_pct for s in after]
        out.append(
            Growth(
                name,
                startup_rss=max(s.rss_bytes for s in before),
                max_rss=max(s.rss_bytes for s in after),
                end_rss=mine[-1].rss_bytes,
                cpu_mean=sum(cpu) / len(cpu),
                cpu_max=max(cpu),
            )
        )
    return out


def print_results(result: RunResult, samples: list[Sample], startup_s: float, work: Path) -> None:
    report = result.report
    samples_csv = result.out_dir / "soak-samples.csv"
    with samples_csv.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t_s", "process", "pid", "rss_bytes", "cpu_pct"])
        for s in samples:
            writer.writerow([f"{s.t_s:.1f}", s.process, s.pid, s.rss_bytes, f"{s.cpu_pct:.1f}"])
    rows = growth(samples, startup_s)
    last = max((s.t_s for s in samples), default=0.0)
    print(f"\nRSS every {SAMPLE_EVERY_S:g} s, {len(samples)} samples over {last:.0f} s; "
          f"start-up: the first {startup_s:g} s (RSS: its largest sample); max, end and CPU "
          "after it")  # fmt: skip
    print("| process | RSS start-up MiB | RSS max MiB | RSS end MiB | growth max % | growth end % "
          "| CPU mean % | CPU max % |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for g in rows:
        print(
            f"| {g.process} | {g.startup_rss / MIB:.1f} | {g.max_rss / MIB:.1f} "
            f"| {g.end_rss / MIB:.1f} | {100 * g.max_growth:+.1f} | {100 * g.end_growth:+.1f} "
            f"| {g.cpu_mean:.0f} | {g.cpu_max:.0f} |"
        )
    grown = [g for g in rows if g.max_growth > FLAT_GROWTH]
    if not rows:
        print("memory: not measured (no process lived past start-up)")
    elif grown:
        names = ", ".join(f"{g.process} {100 * g.max_growth:+.1f}%" for g in grown)
        print(f"memory: NOT flat: above start-up + {100 * FLAT_GROWTH:g}%: {names}")
    else:
        print(f"memory: flat (no process above its start-up RSS + {100 * FLAT_GROWTH:g}%)")
    requests = report.per_request
    status = requests["status"].value_counts().to_dict() if len(requests) else {}
    errors = requests[requests["status"] == "error"] if len(requests) else requests
    kinds = errors["error_kind"].value_counts().to_dict() if len(errors) else {}
    print(f"requests: {len(requests)} ({', '.join(f'{k} {v}' for k, v in status.items())})")
    print(f"errors: {len(errors)}" + (f" by kind {kinds}" if kinds else ""))
    completeness = report.completeness
    verdict = "complete" if completeness.complete else "INCOMPLETE"
    print(f"completeness: {verdict}; rows read {completeness.rows_read}")
    for line in completeness.warnings():
        print(f"  {line}")
    workers = [w for w in report.warnings if "worker" in w]
    print(f"worker warnings: {len(workers) or 'none'}")
    for line in workers:
        print(f"  {line}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"report: {result.out_dir}; samples: {samples_csv}; logs under {work}")
    print(f"this process's peak RSS (the report included): {peak:.0f} MiB")


def _process_order(name: str) -> tuple[int, str]:
    order = {"master": 0, "sim": 8, "weed": 9}
    return order.get(name, 1), name


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _below(value: Any, limit: float) -> bool:
    """A measured value under `limit` (missing is not below anything)."""
    return _finite(value) and float(value) < limit


def _num(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if _finite(value) else "—"


def _echo(line: str) -> None:
    print(f"soak: {line}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
