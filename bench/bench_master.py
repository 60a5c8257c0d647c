"""How many workers one master holds: one master and N worker processes on this machine.

Each N runs one open-loop step (`--rates` N x `--rate-per-worker`, light load: tiny requests
to `llmload sim --profile tiny`) for `--duration` seconds. Workers are forked by Locust's
`--processes` (up to 25 per command), so they share their imported code. The master runs
bench/master_locustfile.py, which notes inside it what is measured, per N:

- the master's CPU (% of one core, over the step) and peak RSS;
- the bytes of each worker's stats report (msgpack, as Locust sends it), and reports/s;
- the age of the live numbers: the longest gap between two reports of one worker (Locust
  sends one every 3 s) and the master's event-loop lag (p99, max), which delays both the
  merge of a report and the page that shows it;
- the finish handshake (RunCoordinator.finish: every worker flushed and confirmed);
- whether every row arrived: each request the simulator answered is a request row in the
  store, once.

N goes up the list until the machine's memory would not hold the next one (from the
workers' RSS per process at the previous N); the output says where it stopped and why.

    .venv/bin/python bench/bench_master.py [--workers 1,10,25,50,100] [--duration 20]

Simulated server: the figures describe llmload's master, not an engine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.ports import free_port  # noqa: E402
from tests.support.chat import BIN, run_requests, start_sim  # noqa: E402

LOCUSTFILE = ROOT / "bench" / "master_locustfile.py"
PER_COMMAND = 25  # workers forked by one `locust --worker --processes K`
MEMORY_USE = 0.8  # of the memory available, at most, for the next N's workers


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _workers_rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            for p in [parent, *parent.children(recursive=True)]:
                total += p.memory_full_info().uss
        except psutil.Error:
            pass
    return total


def run_one(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out_json = work / "master.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LLMLOAD_BENCH_MASTER_OUT": str(out_json),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    events = work / "runs"
    port = free_port()
    with start_sim(work / "sim", "--profile", "tiny") as sim:
        master_log = (work / "master.log").open("w")
        master = subprocess.Popen(
            [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
             "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
             "--expect-workers", str(n), "--expect-workers-max-wait", "600",
             "--host", sim.url, "--events-uri", str(events), "--spool-dir", str(work / "spool"),
             "--rates", f"{n * args.rate_per_worker:g}", "--step-duration", str(args.duration),
             "--step-warmup", "2", "--cold-requests", "0", "--workload", "D(16,4)",
             "--seed", "0"],
            stdout=master_log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        workers: list[subprocess.Popen[bytes]] = []
        worker_log = (work / "workers.log").open("w")
        left = n
        while left > 0:
            k = min(PER_COMMAND, left)
            cmd = [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--worker", "--master-host",
                   "127.0.0.1", "--master-port", str(port)]  # fmt: skip
            if k > 1:
                cmd += ["--processes", str(k)]
            workers.append(subprocess.Popen(cmd, stdout=worker_log, stderr=subprocess.STDOUT,
                                            env=env, stdin=subprocess.DEVNULL))  # fmt: skip
            left -= k
        rss_peak = 0
        deadline = time.monotonic() + 600 + args.duration * 3
        while master.poll() is None and time.monotonic() < deadline:
            rss_peak = max(rss_peak, _workers_rss([w.pid for w in workers]))
            time.sleep(2)
        if master.poll() is None:
            master.kill()
        for w in workers:
            try:
                w.wait(60)
            except subprocess.TimeoutExpired:
                w.kill()
        truth = sim.truth()
    master_log.close()
    worker_log.close()
    data = json.loads(out_json.read_text())
    (run,) = [p for p in events.iterdir() if p.is_dir()]
    manifest = json.loads((run / "manifest.json").read_text())
    if not manifest.get("steps"):  # the run never got to its step: say why, from the log
        tail = (work / "master.log").read_text().strip().splitlines()[-6:]
        return {"workers": n, "failed": True, "master_exit": master.returncode,
                "status": manifest.get("status"), "log_tail": tail}  # fmt: skip
    step = manifest["steps"][0]
    t0, t1 = step["started_at_ns"] / 1e9, step["ended_at_ns"] / 1e9
    samples = [s for s in data["samples"] if t0 <= s[0] <= t1]
    cpu_pct = (
        100 * (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
        if len(samples) > 1
        else float("nan")
    )
    reports = [r for r in data["reports"] if t0 <= r[0] <= t1]
    gaps: list[float] = []
    by_worker: dict[str, list[float]] = {}
    for when, client, _ in reports:
        by_worker.setdefault(client, []).append(when)
    for times in by_worker.values():
        gaps += [b - a for a, b in zip(times, times[1:], strict=False)]
    rows = run_requests(run)
    answered = {rid for rid, row in truth.items() if row.get("finish_reason")}
    recorded = set(rows["request_id"])
    return {
        "workers": n,
        "workers_reporting": len(by_worker),
        "master_cpu_pct": round(cpu_pct, 1),
        "master_rss_mb": round(max((s[2] for s in data["samples"]), default=0) / 2**20, 1),
        "workers_uss_mb": round(rss_peak / 2**20, 1),
        "report_bytes_p50": _pct([r[2] for r in reports], 0.5),
        "report_bytes_max": max((r[2] for r in reports), default=0),
        "reports_per_s": round(len(reports) / (t1 - t0), 2),
        "report_gap_max_s": round(max(gaps, default=float("nan")), 2),
        "loop_lag_p99_ms": round(_pct(data["lag_ms"], 0.99), 1),
        "loop_lag_max_ms": round(max(data["lag_ms"], default=float("nan")), 1),
        "finish_s": round(data["finish_s"], 2) if data["finish_s"] is not None else None,
        "requests_answered": len(answered),
        "rows": len(rows),
        "rows_missing": len(answered - recorded),
        "rows_duplicated": int(len(rows) - rows["request_id"].nunique()),
        "master_exit": master.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,10,25,50,100")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rate-per-worker", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", type=Path, help="keep each N's logs and events in KEEP/nN")
    args = parser.parse_args()
    levels = [int(x) for x in args.workers.split(",")]
    results: list[dict[str, Any]] = []
    stopped = None
    for n in levels:
        if results and not results[-1].get("failed"):
            per_worker = results[-1]["workers_uss_mb"] / max(1, results[-1]["workers"])
            need = per_worker * n * 2**20
            available = psutil.virtual_memory().available
            if need > MEMORY_USE * available:
                stopped = (f"stopped before {n} workers: about {need / 2**30:.1f} GiB needed "
                           f"({per_worker:.0f} MiB each), {available / 2**30:.1f} GiB available")  # fmt: skip
                break
        if args.keep:
            work = args.keep / f"n{n}"
            work.mkdir(parents=True, exist_ok=True)
            result = run_one(n, args, work)
        else:
            with tempfile.TemporaryDirectory(prefix="llmload-bench-master-") as tmp:
                result = run_one(n, args, Path(tmp))
        results.append(result)
        print(json.dumps(result), flush=True)
        if result.get("failed"):
            stopped = f"stopped at {n} workers: the run did not start its step (log_tail)"
            break
    doc = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "machine": f"{platform.node()} {os.cpu_count()} cores "
                      f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
           "duration_s": args.duration, "rate_per_worker": args.rate_per_worker,
           "results": results, "stopped": stopped}  # fmt: skip
    if stopped:
        print(stopped)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
