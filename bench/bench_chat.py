"""Speed and accuracy of one llmload worker process against the simulated engine.

Starts `llmload sim` (profile tiny, its own core) with a truth log, runs the chat user
headless in ONE Locust process (local runner: master and worker together, event logging
on) at a fixed concurrency with 100-token outputs, then reports:

- SSE events/s the worker consumed and client CPU per request (the Locust process's own
  user+system time over the requests it made);
- timestamp accuracy against the simulator's truth log: TTFT p99 (client) − TTFT p99
  (server) and per-token latency p99 (client vs server, same per-token definition);
- per-request error against the truth log, joined by request id: client TTFT − server TTFT
  and client E2E − server E2E (the server's times count from when it had read the request;
  its E2E ends when it wrote the body's last bytes), p50/p99/max over the steady window,
  split by whether a stall of the worker's own loop touched the request; every request's
  errors go to `accuracy.csv` in the bench's folder (printed at the end);
- what the report says of the worker itself: `worker_cpu_max_pct`, `loop_lag_p99_ms`,
  stalls, stalled requests, and its "saturated" warnings.

    .venv/bin/python bench/bench_chat.py [--concurrency 64] [--duration 20] [--tokens 100]

Simulated engine: these figures describe llmload's client, not inference performance.
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

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.derive.metrics import compute_request_metrics  # noqa: E402
from tests.support.chat import BIN, LOCUSTFILE, start_sim  # noqa: E402


def per_token_samples(offsets: list[int], tokens: list[int]) -> list[float]:
    """The documented ITL rule applied to a list of (offset, tokens) events."""
    out: list[float] = []
    prev = None
    for off, k in zip(offsets, tokens, strict=True):
        if k <= 0:
            continue
        if prev is None:
            out.extend([0.0] * (k - 1))
        else:
            out.extend([(off - prev) / k / 1e9] * k)
        prev = off
    return out


def worker_command(url: str, work: Path, args: argparse.Namespace) -> list[str]:
    """One headless Locust process running the chat user against `url`: one step of
    `args.concurrency` users for `args.duration` s (2 s warm-up), `D(32,args.tokens)`, events
    under `work`/runs."""
    return [str(BIN / "locust"), "-f", str(LOCUSTFILE), "--headless", "--only-summary",
            "--host", url, "--events-uri", str(work / "runs"), "--steps", str(args.concurrency),
            "--step-duration", str(args.duration), "--step-warmup", "2", "--cold-requests", "0",
            "--workload", f"D(32,{args.tokens})", "--spool-dir", str(work / "spool")]  # fmt: skip


def steady_rate(requests: Any, chunks: Any, lo: int, hi: int) -> float:
    """Events/s in the steady window: chunk arrivals (wall clock) inside [lo, hi]."""
    wall = chunks.merge(requests[["request_id", "sent_at_ns"]], on="request_id")
    wall = wall["sent_at_ns"] + wall["offset_ns"]
    return float(wall.between(lo, hi).sum() / ((hi - lo) / 1e9))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--tokens-per-event", default="1")
    parser.add_argument("--gc-freeze", default="on", choices=["on", "off"])
    parser.add_argument(
        "--reference", default="on", choices=["on", "off"],
        help="after llmload, run bench/ref_client.py (a minimal asyncio client) against the "
        "same simulator, same concurrency, duration and output length, and compare",
    )  # fmt: skip
    parser.add_argument(
        "--sim-args", nargs=argparse.REMAINDER, default=[], help="extra llmload sim flags"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmload-bench-chat-"))
    cores = sorted(os.sched_getaffinity(0))
    sim_args = [
        "--tokens-per-event",
        args.tokens_per_event,
        "--output-len",
        str(args.tokens),
        *args.sim_args,
    ]
    with start_sim(work / "sim", *sim_args) as sim:
        if len(cores) > 1:
            os.sched_setaffinity(sim.proc.pid, {cores[0]})
        cmd = [*worker_command(sim.url, work, args), "--gc-freeze", args.gc_freeze]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, {cores[-1]})) if len(cores) > 1 else None)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        output = proc.stdout.read() if proc.stdout else ""
        ref_rows: list[dict[str, object]] = []
        if args.reference == "on":
            ref_out = work / "reference.jsonl"
            subprocess.run(
                [sys.executable, str(ROOT / "bench" / "ref_client.py"), "--url", sim.url,
                 "--model", "llmload-sim-tiny", "--concurrency", str(args.concurrency),
                 "--duration", str(args.duration + 2), "--tokens", str(args.tokens),
                 "--out", str(ref_out)],
                check=True, timeout=args.duration + 120,
                preexec_fn=(lambda: os.sched_setaffinity(0, {cores[-1]})) if len(cores) > 1 else None,
            )  # fmt: skip
            ref_rows = [json.loads(x) for x in ref_out.read_text().splitlines() if x.strip()]
        truth = sim.truth()
    if os.waitstatus_to_exitcode(status) != 0:
        print(output)
        raise SystemExit("locust failed")
    run = next(p for p in (work / "runs").iterdir() if p.is_dir())
    import pyarrow.parquet as pq

    requests = pq.read_table(run / "requests").to_pandas()
    chunks = pq.read_table(run / "chunks").to_pandas()
    manifest = json.loads((run / "manifest.json").read_text())
    step = manifest["steps"][0]
    lo = step["spawned_at_ns"] + int(step["warmup_s"] * 1e9)
    hi = step["ended_at_ns"]
    cpu = usage.ru_utime + usage.ru_stime
    n_req = len(requests)
    total_events = int(requests["events"].sum())
    ok = requests[requests["status"] == "ok"]
    arrive = ok["sent_at_ns"].to_numpy()[:, None]
    steady_events_per_s = steady_rate(requests, chunks, lo, hi)
    del arrive
    # accuracy against the truth log (ok requests sent inside the steady window)
    steady = ok[ok["sent_at_ns"].between(lo, hi)]
    metrics = compute_request_metrics(steady.reset_index(drop=True), chunks)
    client_ttft = metrics.per_request["ttft_s"].to_numpy()
    server_ttft, server_itl = [], []
    for rid in steady["request_id"]:
        ev = [e for e in truth[rid]["events"] if e[1] > 0]
        server_ttft.append(ev[0][0] / 1e9)
        server_itl.extend(per_token_samples([e[0] for e in ev], [e[1] for e in ev]))
    client_itl = metrics.itl.expand()
    # per request, joined by id: client minus server (TTFT, and E2E to the last byte written)
    client_e2e = metrics.per_request["e2e_s"].to_numpy()
    ttft_err, e2e_err = [], []
    for i, rid in enumerate(steady["request_id"]):
        ev = truth[rid]["events"]
        first = next(e for e in ev if e[1] > 0)
        ttft_err.append(client_ttft[i] - first[0] / 1e9)
        e2e_err.append(client_e2e[i] - ev[-1][0] / 1e9)
    p99 = lambda a: float(np.percentile(np.asarray(a), 99))  # noqa: E731
    ttft_err_ms = (p99(client_ttft) - p99(server_ttft)) * 1e3
    itl_err = p99(client_itl) / p99(server_itl) - 1
    print(
        f"date: {datetime.date.today()}  machine: {platform.node()} {os.cpu_count()} cores, python {platform.python_version()}"
    )
    print(f"command: {' '.join(sys.argv)}")
    print(
        f"concurrency {args.concurrency}, {args.tokens} output tokens/request, {args.tokens_per_event} token(s)/event"
    )
    print(
        f"requests: {n_req:,} ({len(ok):,} ok), SSE events received: {total_events:,}, wall {wall:.1f} s"
    )
    print(
        f"worker process CPU: {cpu:.1f} s -> {cpu / n_req * 1e3:.3f} ms per request, {cpu / max(total_events, 1) * 1e6:.2f} µs per event"
    )
    print(f"steady-window output events/s: {steady_events_per_s:,.0f}")
    print(
        f"TTFT p99: client {p99(client_ttft) * 1e3:.2f} ms, server {p99(server_ttft) * 1e3:.2f} ms, error {ttft_err_ms:+.2f} ms"
    )
    print(
        f"per-token latency p99: client {p99(client_itl) * 1e3:.3f} ms, server {p99(server_itl) * 1e3:.3f} ms, error {itl_err:+.1%}"
    )
    for name, err in (("TTFT", ttft_err), ("E2E", e2e_err)):
        e = np.asarray(err) * 1e3
        print(
            f"per-request {name} error vs server (ms): p50 {np.percentile(e, 50):+.2f}, "
            f"p99 {np.percentile(e, 99):+.2f}, max {e.max():+.2f}, min {e.min():+.2f} "
            f"({len(e):,} requests)"
        )
    # the same, counted from the kernel's arrival of the request at the simulator: how long
    # its loop took to read the bytes is the server's time, not the client's error
    read_wait = np.array([_read_wait_ms(truth[r]) for r in steady["request_id"]])
    known = ~np.isnan(read_wait)
    if known.any():
        w = read_wait[known]
        print(
            f"simulator read wait (kernel arrival -> request read; {int(known.sum()):,} of "
            f"{len(read_wait):,} requests stamped): p50 {np.percentile(w, 50):.2f} p99 "
            f"{np.percentile(w, 99):.2f} max {w.max():.2f} ms"
        )
        for name, err in (("TTFT", ttft_err), ("E2E", e2e_err)):
            e = np.asarray(err)[known] * 1e3 - w
            print(
                f"per-request {name} error vs server from the kernel's arrival (ms): p50 "
                f"{np.percentile(e, 50):+.2f}, p99 {np.percentile(e, 99):+.2f}, max "
                f"{e.max():+.2f}, min {e.min():+.2f}"
            )
    # per request: where the error came from (written beside the events for a closer look)
    stalled = steady["worker_stall_ns"].to_numpy() > 0
    errors = pd.DataFrame(
        {
            "request_id": steady["request_id"].to_numpy(),
            "sent_s": (steady["sent_at_ns"].to_numpy() - step["spawned_at_ns"]) / 1e9,
            "ttft_error_ms": np.asarray(ttft_err) * 1e3,
            "e2e_error_ms": np.asarray(e2e_err) * 1e3,
            "worker_stall_ms": steady["worker_stall_ns"].to_numpy() / 1e6,
        }
    )
    errors.to_csv(work / "accuracy.csv", index=False)
    for label, part in (("not stalled", errors[~stalled]), ("stalled", errors[stalled])):
        if len(part):
            print(
                f"  {label}: {len(part):,} requests, TTFT error p99 "
                f"{np.percentile(part['ttft_error_ms'], 99):+.2f} ms, max "
                f"{part['ttft_error_ms'].max():+.2f} ms"
            )
    # the first request on each new connection (the spawn): timed from the write (1.4), and
    # what the same request would have shown timed from the decision to send (before 1.4)
    if "connect_new" in ok:
        fresh = ok[ok["connect_new"].fillna(False).astype(bool)].reset_index(drop=True)
        fresh_metrics = compute_request_metrics(fresh, chunks).per_request["ttft_s"].to_numpy()
        server_first = np.array(
            [next(e for e in truth[r]["events"] if e[1] > 0)[0] / 1e9 for r in fresh["request_id"]]
        )
        err_write = (fresh_metrics - server_first) * 1e3
        # the simulator's own accept queue, when the request waited in it (the kernel had its
        # bytes before the server read them): server time, not the client's error
        accept_wait = np.array(
            [
                (truth[r]["arrival_unix_ns"] - truth[r]["kernel_arrival_unix_ns"]) / 1e6
                if truth[r].get("kernel_arrival_unix_ns")
                else 0.0
                for r in fresh["request_id"]
            ]
        )
        err_kernel = err_write - accept_wait
        print(
            f"first request on each new connection: TTFT error vs the server counted from the "
            f"kernel's arrival of its bytes (the accept queue is the server's; "
            f"{int((accept_wait > 0).sum())} waited in it, p99 "
            f"{np.percentile(accept_wait, 99):.2f} ms): p50 {np.percentile(err_kernel, 50):+.2f} "
            f"p99 {np.percentile(err_kernel, 99):+.2f} max {err_kernel.max():+.2f} ms"
        )
        err_decided = err_write + fresh["client_delay_ns"].to_numpy(np.float64) / 1e6
        connect = fresh["connect_ns"].to_numpy(np.float64) / 1e6
        print(
            f"first request on each new connection ({len(fresh)}): TTFT error vs server, from "
            f"the write p50 {np.percentile(err_write, 50):+.2f} p99 "
            f"{np.percentile(err_write, 99):+.2f} max {err_write.max():+.2f} ms; from the "
            f"decision to send (as before schema 1.4) p50 {np.percentile(err_decided, 50):+.2f} "
            f"p99 {np.percentile(err_decided, 99):+.2f} max {err_decided.max():+.2f} ms; "
            f"connect p99 {np.nanpercentile(connect, 99):.2f} ms"
        )
    steady_delay = (
        steady["client_delay_ns"].to_numpy(np.float64) / 1e6
        if "client_delay_ns" in steady
        else None
    )
    if steady_delay is not None:
        print(
            f"steady client delay (decided -> written): p50 {np.nanpercentile(steady_delay, 50):.2f} "
            f"p99 {np.nanpercentile(steady_delay, 99):.2f} ms"
        )
    if ref_rows:
        ref_lo = min(int(r["sent_at_ns"]) for r in ref_rows) + 2_000_000_000  # type: ignore[call-overload]
        ref_err = (
            np.array(
                [
                    float(r["ttft_s"])
                    - next(e for e in truth[str(r["request_id"])]["events"] if e[1] > 0)[0] / 1e9  # type: ignore[arg-type]
                    for r in ref_rows
                    if r["ttft_s"] is not None
                    and int(r["sent_at_ns"]) >= ref_lo  # type: ignore[call-overload]
                    and str(r["request_id"]) in truth
                ]
            )
            * 1e3
        )
        ref_wait = np.array(
            [
                _read_wait_ms(truth[str(r["request_id"])])
                for r in ref_rows
                if r["ttft_s"] is not None
                and int(r["sent_at_ns"]) >= ref_lo  # type: ignore[call-overload]
                and str(r["request_id"]) in truth
            ]
        )
        if (~np.isnan(ref_wait)).any():
            ok_ref = ~np.isnan(ref_wait)
            ref_k = ref_err[ok_ref] - ref_wait[ok_ref]
            mine_k = (np.asarray(ttft_err) * 1e3 - read_wait)[known]
            print(
                f"  from the kernel's arrival: reference TTFT error p50 "
                f"{np.percentile(ref_k, 50):+.2f} p99 {np.percentile(ref_k, 99):+.2f} ms; "
                f"llmload p50 {np.percentile(mine_k, 50):+.2f} p99 "
                f"{np.percentile(mine_k, 99):+.2f} ms"
            )
        mine = np.asarray(ttft_err) * 1e3
        print(
            f"reference asyncio client ({len(ref_err):,} steady requests): TTFT error p50 "
            f"{np.percentile(ref_err, 50):+.2f} p99 {np.percentile(ref_err, 99):+.2f} max "
            f"{ref_err.max():+.2f} ms; llmload p50 {np.percentile(mine, 50):+.2f} p99 "
            f"{np.percentile(mine, 99):+.2f} ms; llmload - reference at p99: "
            f"{np.percentile(mine, 99) - np.percentile(ref_err, 99):+.2f} ms"
        )
    coalesced = int(steady["coalesced_events"].sum())
    print(
        f"events sharing a read with the one before: {coalesced:,} of {int(steady['events'].sum()):,}"
    )
    from analysis import build_report

    report = build_report(str(run), work / "report", progress=False, html=False)
    row = report.step_rows[0]
    print(
        f"report: worker_cpu_max_pct {row['worker_cpu_max_pct']:.0f}, loop_lag_p99_ms "
        f"{row['loop_lag_p99_ms']:.2f}, worker_stalls {row['worker_stalls']}, "
        f"requests_worker_stalled {row['requests_worker_stalled']}"
    )
    for warning in report.warnings:
        if "saturated" in warning or "stall" in warning:
            print(f"report warning: {warning}")
    print(f"(simulated engine: not inference performance)  events under {work}")
    print(f"per-request errors: {work / 'accuracy.csv'}")


def _read_wait_ms(line: dict[str, Any]) -> float:
    """ms from the kernel's arrival of a request at the simulator to its loop reading it
    (truth log `kernel_arrival_unix_ns`); NaN when the simulator could not stamp it."""
    kernel = line.get("kernel_arrival_unix_ns")
    return (line["arrival_unix_ns"] - kernel) / 1e6 if kernel else float("nan")


if __name__ == "__main__":
    main()
