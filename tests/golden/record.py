"""Record the golden runs and their expected reports (tests/golden/cases.py says what they are).

    PYTHONPATH=. .venv/bin/python tests/golden/record.py                 # every case, anew
    PYTHONPATH=. .venv/bin/python tests/golden/record.py rate spans      # some cases
    PYTHONPATH=. .venv/bin/python tests/golden/record.py --reports-only  # keep the runs,
                                                                          # write expected/ again

Each case starts `llmload sim` (a subprocess on a free 127.0.0.1 port, seed 0, the helpers of
tests/support/chat.py, as the e2e tests do), runs Locust headless (or `llmload campaign` for
the demo's plan) in a scratch folder with its events in a file store there (relative paths:
the manifest records no scratch folder's name), copies the run folder
to tests/golden/events/<name>/<run_id>/ and writes the report of the stored copy, normalised,
to tests/golden/expected/<name>/. Runs are short (a few seconds, low concurrency) and seeded
(the workload's and the simulator's random streams); their timings are real, so a new
recording gives other figures: record again only when the runs themselves must change, and
use --reports-only after a deliberate change of the reports.

Not run by the tests (it takes about two minutes); the tests only read what it wrote.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from infra.ports import free_port  # noqa: E402
from tests.golden.cases import (  # noqa: E402
    CASES,
    EVENTS,
    EXPECTED,
    FILES,
    Case,
    make_report,
    normalised,
    run_dir,
)
from tests.support.chat import BIN, run_locust, start_sim  # noqa: E402

SIM = ("--seed", "0")
TIMEOUT_S = 150


def _locust(sim_args: tuple[str, ...], *args: str, workers: int = 0) -> Callable[[Path], None]:
    """A case run by `run_locust`: the simulator with `sim_args`, Locust with `args`."""

    def record(work: Path) -> None:
        with start_sim(work / "sim", *SIM, *sim_args) as sim, contextlib.chdir(work):
            result = run_locust(sim.url, Path("events"), "--seed", "0", *args,
                                workers=workers, timeout=TIMEOUT_S)  # fmt: skip
        (work / "locust.log").write_text(result.output)
        assert result.returncode == 0, result.output[-3000:]

    return record


def _demo(work: Path) -> None:
    """The demo's campaign (infra/commands/demo.py: its workload, simulator profile, cold
    requests, workers and engine facts), shortened to steps 1,2,4 of 3 s, with its events in
    a file store instead of the demo's SeaweedFS (the run is the same either way)."""
    import yaml

    from infra.commands.demo import SIM_PROFILE, WORKLOAD

    with start_sim(work / "sim", *SIM, "--profile", SIM_PROFILE) as sim:
        config = {
            "name": "demo",
            "target": {"url": sim.url},
            "workload": [{"name": "mixed", "spec": WORKLOAD}],
            "steps": "1,2,4",
            "step_duration": 3,
            "step_warmup": 1,
            "cold_requests": 3,
            "events_uri": "events",
            "workers": 2,
            "worker_wait": 30,
            "report_dir": "campaign-reports",
            "engine": {
                "model_full_name": f"llmload-sim-{SIM_PROFILE} (simulated)",
                "hardware": f"none: simulated engine (llmload sim --profile {SIM_PROFILE})",
            },
            "extra": ["--seed", "0", "--spool-dir", "spool"],
        }
        path = work / "demo.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        done = subprocess.run(
            [str(BIN / "llmload"), "campaign", str(path)],
            capture_output=True, text=True, timeout=TIMEOUT_S, cwd=work,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    (work / "campaign.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def _spans(work: Path) -> None:
    """As tests/e2e/test_otlp_spans.py: the simulator posts its spans to the master."""
    port = free_port()
    _locust(
        ("--output-len", "16", "--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces"),
        "--run-id", "golden-spans", "--steps", "1,2", "--step-duration", "3",
        "--step-warmup", "0.5", "--cold-requests", "0", "--workload", "D(32,16)",
        "--otlp-listen", f"127.0.0.1:{port}", "--otlp-linger", "1",
    )(work)  # fmt: skip


RATE = ("--run-id", "golden-rate", "--rates", "5,10", "--arrival", "poisson",
        "--step-duration", "3", "--step-warmup", "0.5", "--cold-requests", "2",
        "--workload", "D(16,8)")  # fmt: skip
# as tests/e2e/test_sessions.py: the simulator's prefix cache made predictable; tool calls
SESSION_SIM = ("--prefill-per-token-us", "200", "--decode-base-ms", "5",
               "--decode-per-seq-us", "0", "--decode-per-kv-token-ns", "0", "--block-size", "16",
               "--tool-call-rate", "0.5")  # fmt: skip
SESSION = ("--run-id", "golden-session", "--steps", "2", "--step-duration", "4",
           "--step-warmup", "0.5", "--cold-requests", "0", "--turns", "3",
           "--workload", "D(256,16)", "--followup-workload", "D(32,16)", "--think-time", "0.2",
           "--tool-rate", "0.3", "--tool-latency", "0.1")  # fmt: skip
# as tests/e2e/test_trace_replay.py (two workers), on a 10 s window of the trace
TRACE = ("--run-id", "golden-trace",
         "--workload", "trace:examples/traces/mooncake.jsonl",
         "--trace-speedup", "5", "--trace-duration", "10", "--step-duration", "4",
         "--cold-requests", "0")  # fmt: skip

RECORDERS: dict[str, Callable[[Path], None]] = {
    "demo": _demo,
    "rate": _locust(("--profile", "tiny"), *RATE),
    "session": _locust(SESSION_SIM, *SESSION),
    "trace": _locust(("--profile", "tiny"), *TRACE, workers=2),
    "spans": _spans,
}


def record_run(case: Case, scratch: Path) -> None:
    work = scratch / case.name
    work.mkdir(parents=True)
    (work / "examples").symlink_to(ROOT / "examples")  # paths in the manifest: relative ones
    RECORDERS[case.name](work)
    source = run_dir(work / "events")
    target = EVENTS / case.name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target / source.name)
    print(f"{case.name}: run {source.name} stored in {target.relative_to(ROOT)}", flush=True)


def write_expected(case: Case, scratch: Path) -> None:
    """The stored run's report, as the test makes it (a copy of the store, a file:// URI)."""
    copy = scratch / f"{case.name}-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(EVENTS / case.name, copy)
    run_uri = f"file://{run_dir(copy)}"
    out = scratch / f"{case.name}-report"
    make_report(run_uri, out, case.report_args)
    expected = EXPECTED / case.name
    shutil.rmtree(expected, ignore_errors=True)
    expected.mkdir(parents=True)
    for name in FILES:
        text = (out / name).read_text()
        (expected / name).write_text(normalised(name, text, run_uri))
    print(f"{case.name}: expected report in {expected.relative_to(ROOT)}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--reports-only", action="store_true",
                        help="keep the stored runs; write expected/ again")  # fmt: skip
    args = parser.parse_args()
    names = args.cases or [c.name for c in CASES]
    chosen = [c for c in CASES if c.name in names]
    assert len(chosen) == len(names), f"unknown case in {names}"
    scratch = Path(tempfile.mkdtemp(prefix="llmload-golden-"))
    # a headless run without --report-dir leaves an empty mkdtemp folder behind: keep them here
    os.environ["TMPDIR"] = str(scratch / "tmp")
    (scratch / "tmp").mkdir()
    try:
        for case in chosen:
            if not args.reports_only:
                record_run(case, scratch)
            write_expected(case, scratch)
    except BaseException:
        print(f"kept {scratch} (logs)", file=sys.stderr)
        raise
    shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
