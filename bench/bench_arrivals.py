"""The highest arrival rate one worker process sustains with send slip p99 <= 10 ms.

Starts `llmload sim` (pinned to one core, short requests) with a truth log, and runs ONE
Locust process (local runner: master and worker together, events logged) with open-loop
rate steps (`--rates`, Poisson arrivals by default) on the other core. Per step, from the
events and the server's truth log:

- achieved send rate (requests sent in the steady window / its length) against intended;
- slip (sent_at - intended - queued) p50/p99/max: how late the generator sent;
- the rate the server saw (truth-log arrivals in the window), requests in flight on average,
  and the worker's CPU max and loop-lag p99 from the report.

A step is sustained when its slip p99 is <= 10 ms and it sent at least 95% of the arrivals
its schedule had due in the window (seed 0; a Poisson count itself varies around rate x s);
the answer is the highest sustained rate.

    .venv/bin/python bench/bench_arrivals.py [--rates 50,100,200,400,800] [--duration 10]

Simulated engine: these figures describe llmload's load generator, not inference.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from locustfiles.traffic.arrivals import Schedule  # noqa: E402
from tests.support.chat import BIN, LOCUSTFILE, start_sim  # noqa: E402

SLIP_LIMIT_MS = 10.0
RATE_SHORTFALL = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,100,200,400,800")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--arrival", default="poisson")
    parser.add_argument("--tokens", type=int, default=8, help="output tokens per request")
    parser.add_argument(
        "--sim-args", nargs=argparse.REMAINDER, default=[], help="extra llmload sim flags"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmload-bench-arrivals-"))
    cores = sorted(os.sched_getaffinity(0))
    sim_args = ["--output-len", str(args.tokens), "--max-num-seqs", "1024",
                "--decode-base-ms", "2", "--decode-per-seq-us", "0",
                "--decode-per-kv-token-ns", "0", *args.sim_args]  # fmt: skip
    with start_sim(work / "sim", *sim_args) as sim:
        if len(cores) > 1:
            os.sched_setaffinity(sim.proc.pid, {cores[0]})
        cmd = [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
               "--host", sim.url, "--events-uri", str(work / "runs"), "--rates", args.rates,
               "--arrival", args.arrival, "--step-duration", str(args.duration),
               "--step-warmup", str(args.warmup), "--cold-requests", "0",
               "--workload", f"D(16,{args.tokens})", "--spool-dir", str(work / "spool"),
               "--scrape-interval", "0"]  # fmt: skip
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, {cores[-1]})) if len(cores) > 1 else None)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        output = proc.stdout.read() if proc.stdout else ""
        truth = sim.truth()
    if os.waitstatus_to_exitcode(status) != 0:
        print(output)
        raise SystemExit("locust failed")
    run = next(p for p in (work / "runs").iterdir() if p.is_dir())
    import pyarrow.parquet as pq

    from analysis import build_report

    requests = pq.read_table(run / "requests").to_pandas()
    manifest = json.loads((run / "manifest.json").read_text())
    report = build_report(str(run), work / "report", progress=False, html=False)
    rows = {r["step"]: r for r in report.step_rows if r.get("group") == "step"}
    print(
        f"date: {datetime.date.today()}  machine: {platform.node()} {os.cpu_count()} cores, "
        f"python {platform.python_version()}"
    )
    print(f"command: {' '.join(sys.argv)}")
    print(f"{args.arrival} arrivals, {args.tokens} output tokens/request, one worker process; "
          f"wall {wall:.0f} s, worker CPU {usage.ru_utime + usage.ru_stime:.1f} s")  # fmt: skip
    print("| rate/s | due/s (schedule) | sent/s | server saw/s | slip p50 ms | slip p99 ms | slip max ms | "
          "in flight | worker CPU max % | loop lag p99 ms | sustained |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    best = None
    for step in manifest["steps"]:
        lo = step["spawned_at_ns"] + int(step["warmup_s"] * 1e9)
        hi = step["ended_at_ns"]
        window_s = (hi - lo) / 1e9
        rows_step = requests[(requests["step"] == step["step"]) & (requests["status"] != "dropped")]
        steady = rows_step[rows_step["sent_at_ns"].between(lo, hi)]
        slip = (steady["sent_at_ns"] - steady["intended_ns"] - steady["queued_ns"]) / 1e6
        sent_rate = len(steady) / window_s
        seen = [truth[r]["arrival_unix_ns"] for r in rows_step["request_id"] if r in truth]
        server_rate = sum(lo <= t <= hi for t in seen) / window_s
        row = rows.get(step["step"], {})
        begin = rows_step["sent_at_ns"].to_numpy(np.int64)
        end = begin + rows_step["end_ns"].fillna(0).to_numpy(np.int64)
        overlap = np.clip(np.minimum(end, hi) - np.maximum(begin, lo), 0, None)
        in_flight = overlap.sum() / (hi - lo)
        p99 = float(np.percentile(slip, 99)) if len(slip) else float("nan")
        # the schedule's own arrivals due in the window (a Poisson count varies around rate x s)
        start = step["started_at_ns"]
        due = 0
        for _, t in Schedule(step["rate"], step["arrival"], 0, step["step"]).arrivals():
            at = start + int(t * 1e9)
            if at > hi:
                break
            due += at >= lo
        ok = p99 <= SLIP_LIMIT_MS and len(steady) >= (1 - RATE_SHORTFALL) * due
        if ok:
            best = step["rate"]
        print(
            f"| {step['rate']:g} | {due / window_s:.1f} | {sent_rate:.1f} | {server_rate:.1f} | "
            f"{np.percentile(slip, 50):.2f} | {p99:.2f} | {slip.max():.2f} | "
            f"{in_flight:.1f} | "
            f"{row.get('worker_cpu_max_pct', float('nan')):.0f} | "
            f"{row.get('loop_lag_p99_ms', float('nan')):.2f} | {'yes' if ok else 'no'} |"
        )
    print(f"highest sustained rate (slip p99 <= {SLIP_LIMIT_MS:g} ms, >= "
          f"{1 - RATE_SHORTFALL:.0%} of the rate sent): {best} requests/s")  # fmt: skip
    print(f"(simulated engine: not inference performance)  events under {work}")


if __name__ == "__main__":
    main()
