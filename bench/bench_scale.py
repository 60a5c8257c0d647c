"""Analysis at scale: write a run of N chunk rows with bounded memory, then time reading it.

    .venv/bin/python bench/bench_scale.py --chunks 100000000            # 100M chunk rows
    .venv/bin/python bench/bench_scale.py --chunks 10000000 --keep /tmp/scale

The run is written by tests/support/synthetic.py, worker by worker and part by part (one
part in memory at a time), in a child process. Then each measured command runs as a child
process of its own, its peak RSS read from the kernel (ru_maxrss of the waited child):

- `sql`: `llmload sql` (analysis/read/engine.py, DuckDB, out of core under --memory-limit):
  per-step TTFT p99 and mean ITL over request_metrics, which aggregates every chunk row;
- `report`: `llmload report --no-html --memory-limit [--jobs N]` (analysis/render/build.py:
  the requests and the chunks out of core, analysis/steps/outofcore.py). Stopped at
  --report-limit-s or when its RSS passes --rss-limit-gb, and recorded as such;
- `--compare`: a second run of the same shape (another seed, `bench-run-b`), then
  `llmload compare` of the two (its default bootstrap) and `llmload report` of both (their
  repeats), each measured the same way.

Prints one line per measure and a JSON summary; docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BIN = Path(sys.executable).parent
SQL = (
    "SELECT step, count(*) AS requests, nearest_rank(list(ttft_s), 0.99) AS ttft_p99_s, "
    "avg(itl_mean_s) AS itl_mean_s, sum(chunk_count) AS chunks FROM request_metrics "
    "WHERE status = 'ok' GROUP BY step ORDER BY step"
)


WRITE = (
    "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
    "from tests.support.synthetic import write_run; "
    "write_run(Path(sys.argv[2]), *map(int, sys.argv[3:7]), run_id=sys.argv[7], "
    "seed=int(sys.argv[8]))"
)


def measure(argv: list[str], limit_s: float, rss_limit_gb: float) -> dict[str, object]:
    """Run `argv`; its wall time, its peak RSS (children's ru_maxrss) and how it ended."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watched = psutil.Process(proc.pid)
    ended, peak_seen = "ok", 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak_seen = max(peak_seen, watched.memory_info().rss)
        if time.perf_counter() - start > limit_s:
            ended = f"stopped after {limit_s:.0f} s"
        elif peak_seen > rss_limit_gb * 2**30:
            ended = f"stopped at {peak_seen / 2**30:.1f} GB RSS"
        if ended != "ok":
            proc.kill()
            break
        time.sleep(0.2)
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak_kb = after if after > before else peak_seen // 1024
    if ended == "ok" and proc.returncode != 0:
        ended = f"failed (exit {proc.returncode}): {err.strip().splitlines()[-1:]}"
    return {"wall_s": round(wall, 1), "peak_rss_gb": round(peak_kb / 2**20, 2), "ended": ended}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=10_000_000, help="chunk rows in the run")
    parser.add_argument("--chunks-per-request", type=int, default=10)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--part-rows", type=int, default=1_000_000,
                        help="chunk rows per part (about)")  # fmt: skip
    parser.add_argument("--memory-limit", default="2GB", help="llmload sql --memory-limit")
    parser.add_argument("--keep", type=Path, default=None, help="write the run here, keep it")
    parser.add_argument("--skip-report", action="store_true", help="measure llmload sql only")
    parser.add_argument("--skip-sql", action="store_true", help="do not measure llmload sql")
    parser.add_argument("--jobs", type=int, default=None, help="llmload report --jobs")
    parser.add_argument("--compare", action="store_true",
                        help="also a second run: llmload compare and the repeats of both")  # fmt: skip
    parser.add_argument("--report-limit-s", type=float, default=900.0)
    parser.add_argument("--rss-limit-gb", type=float, default=12.0)
    args = parser.parse_args()
    parts = max(1, args.chunks // (args.workers * args.part_rows))
    with tempfile.TemporaryDirectory(prefix="llmload-scale-") as tmp:
        root = args.keep or Path(tmp)
        run = root / "bench-run"
        t = time.perf_counter()
        requests = args.chunks // args.chunks_per_request
        names = [("bench-run", 42)] + ([("bench-run-b", 43)] if args.compare else [])
        written: dict[str, object] = {"wall_s": 0.0, "peak_rss_gb": None, "ended": "reused"}
        for name, seed in names:
            if not (root / name).exists():
                written = measure([sys.executable, "-c", WRITE, str(ROOT), str(root), str(requests),
                                   str(args.chunks_per_request), str(args.workers), str(parts),
                                   name, str(seed)], 1e9, 1e9)  # fmt: skip
        size = sum(p.stat().st_size for p in run.rglob("*.parquet"))
        print(f"run: {args.chunks:,} chunk rows, {args.chunks // args.chunks_per_request:,} "
              f"requests, {args.workers} workers x {parts} parts, {size / 2**30:.2f} GiB "
              f"of Parquet; written in {time.perf_counter() - t:.0f} s "
              f"(peak RSS {written['peak_rss_gb']} GB)", flush=True)  # fmt: skip
        results: dict[str, object] = {"chunks": args.chunks, "requests": requests,
                                      "chunks_per_request": args.chunks_per_request,
                                      "parquet_gib": round(size / 2**30, 2), "write": written,
                                      "jobs": args.jobs or os.cpu_count()}  # fmt: skip
        if not args.skip_sql:
            spill = Path(tempfile.mkdtemp(prefix="llmload-scale-spill-"))
            try:
                results["sql"] = measure([str(BIN / "llmload"), "sql", str(run), SQL,
                                          "--memory-limit", args.memory_limit, "--spill-dir",
                                          str(spill)], args.report_limit_s, args.rss_limit_gb)  # fmt: skip
            finally:
                shutil.rmtree(spill, ignore_errors=True)
            print(f"llmload sql (--memory-limit {args.memory_limit}): {results['sql']}", flush=True)
        jobs = ["--jobs", str(args.jobs)] if args.jobs else []
        common = ["--quiet", "--memory-limit", args.memory_limit, *jobs]
        if not args.skip_report:
            out = Path(tmp) / "report"
            results["report"] = measure([str(BIN / "llmload"), "report", str(run), "--out",
                                         str(out), "--no-html", *common],
                                        args.report_limit_s, args.rss_limit_gb)  # fmt: skip
            print(f"llmload report --no-html: {results['report']}", flush=True)
        if args.compare:
            other = root / "bench-run-b"
            results["compare"] = measure([str(BIN / "llmload"), "compare", str(run), str(other),
                                          "--out", str(Path(tmp) / "compare")],
                                         args.report_limit_s, args.rss_limit_gb)  # fmt: skip
            print(f"llmload compare: {results['compare']}", flush=True)
            results["repeats"] = measure([str(BIN / "llmload"), "report", str(run), str(other),
                                          "--out", str(Path(tmp) / "repeats"), "--no-html",
                                          *common], args.report_limit_s * 2, args.rss_limit_gb)  # fmt: skip
            print(f"llmload report (2 runs, repeats): {results['repeats']}", flush=True)
        print(json.dumps({**results, "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
