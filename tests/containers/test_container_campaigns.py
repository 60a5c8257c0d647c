"""Campaigns in containers: llmload's image built on a local Debian base, the compose file
under podman-compose, the Kubernetes manifests under `podman kube play` (`make
test-containers`). Each campaign runs the store, the simulator (with its truth log), a master
and two workers, each in a container of its own, to the end; `llmload report` in a container
makes the report, whose per-step counts must be the simulator's. Everything made here is
removed (the cached base image stays); the stages' times are printed at the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from infra.ports import free_port
from tests.containers.engine import BASE_IMAGE, ROOT, Podman, Stages, unavailable
from tests.containers.kube import render
from tests.support.chat import assert_steps_match_the_truth

pytestmark = [pytest.mark.containers, pytest.mark.timeout(900)]

WORKERS = 2
ACCESS_KEY, SECRET_KEY = "LLMLOADCONTAINERS", "containers-secret-not-real"
CAMPAIGN = {  # short: two steps of 4 s after two cold requests
    "LOCUST_WORKLOAD": "D(24,12)",
    "LOCUST_STEPS": "1,2",
    "LOCUST_STEP_DURATION": "4",
    "LOCUST_STEP_WARMUP": "0.5",
    "LOCUST_COLD_REQUESTS": "2",
}
WAIT_S = 240  # for a campaign's master to finish (the campaign itself takes ~15 s)


class _StagesReport:
    """Prints the stages' times in pytest's closing summary (outside any capture)."""

    def __init__(self, stages: Stages) -> None:
        self.stages = stages

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.stages.times:
            terminalreporter.write_sep("-", "test-containers: stages")
            for line in self.stages.lines():
                terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def stages(request: pytest.FixtureRequest) -> Stages:
    recorder = Stages()
    request.config.pluginmanager.register(_StagesReport(recorder), "llmload-container-stages")
    return recorder


@pytest.fixture(scope="session")
def engine() -> Iterator[Podman]:
    """Podman, configured; whatever the tests make is gone afterwards (the base image stays)."""
    why = unavailable()
    if why:
        pytest.skip(why)
    podman = Podman()
    before = podman.inventory()
    yield podman
    podman.remove_new_pause_image(before)
    left = podman.leftovers(before)
    left["images"] = {i for i in left.get("images", set()) if BASE_IMAGE not in i}
    assert not any(left.values()), f"left behind: {left}"


@pytest.fixture(scope="session")
def image(
    engine: Podman, stages: Stages, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """llmload's image built on the Debian base (made once, then cached); removed after."""
    tag = f"localhost/llmload-ct:{uuid.uuid4().hex[:8]}"
    with stages("base image") as stage:
        base, cached = engine.base_image(tmp_path_factory.mktemp("base"))
        stage.append("cached" if cached else "made: debootstrap, podman import")
    try:
        with stages("llmload image: podman build"):
            engine.build(base, tag)
        yield tag
    finally:
        with stages("clean-up: the image"):
            engine.run("rmi", "-f", tag, check=False)


def _podman_compose() -> str:
    beside = Path(sys.executable).parent / "podman-compose"
    found = str(beside) if beside.exists() else shutil.which("podman-compose")
    assert found, "podman-compose is missing: `make test-containers` installs it into .venv"
    return found


def _truth(path: Path) -> dict[str, dict[str, object]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return {r["request_id"]: r for r in rows if not r["request_id"].startswith("probe-")}


def assert_report_is_the_truth(report: Path, truth_log: Path) -> pd.DataFrame:
    """The report's per-step counts are the simulator's (every request it saw is a row, once);
    returns the report's request rows."""
    rows = pd.read_parquet(report / "requests.parquet")
    truth = _truth(truth_log)
    assert_steps_match_the_truth(rows, truth, json.loads((report / "summary.json").read_text()))
    return rows


def assert_workers_apart(rows: pd.DataFrame, hosts: dict[str, str]) -> None:
    """Every worker (hostname -> address) sent requests of the run, from an address of its own."""
    assert len(hosts) == WORKERS and len(set(hosts.values())) == WORKERS, hosts
    ids = set(rows["worker_id"])
    assert len(ids) == WORKERS, ids
    for hostname in hosts:
        assert any(i.startswith(f"{hostname}-") for i in ids), (hostname, ids)


def _address(engine: Podman, container: str) -> tuple[str, str]:
    out = engine.run(
        "inspect", container, "--format",
        "{{.Config.Hostname}} {{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
    ).stdout.split()  # fmt: skip
    return out[0], out[1]


def _wait_exit(engine: Podman, container: str) -> None:
    code = engine.run("wait", container, timeout=WAIT_S).stdout.strip()
    if code != "0":
        logs = engine.run("logs", container, check=False)
        pytest.fail(f"{container} exited {code}:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")


def _save_logs(engine: Podman, prefix: str, folder: Path) -> None:
    """Every log of the containers named `prefix*` into `folder` (tmp_path: kept by pytest)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in engine.lines("ps", "-a", "--format", "{{.Names}}"):
        if name.startswith(prefix):
            out = engine.run("logs", "-t", name, check=False)
            (folder / f"{name}.log").write_text(out.stdout + out.stderr)


def _shared_dir(path: Path) -> Path:
    """A host folder the image's user (uid 1000) writes into."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


@dataclass
class Campaign:
    """A campaign's run id, and the host folders of the simulator's truth log and the report."""

    run_id: str
    truth_dir: Path
    reports: Path

    @property
    def uri(self) -> str:
        return f"s3://llmload/runs/{self.run_id}"

    def check_report(self) -> pd.DataFrame:
        return assert_report_is_the_truth(
            self.reports / self.run_id, self.truth_dir / "truth.jsonl"
        )


@pytest.fixture
def campaign(tmp_path: Path) -> Campaign:
    run_id = f"ct-{uuid.uuid4().hex[:8]}"
    return Campaign(run_id, _shared_dir(tmp_path / "truth"), _shared_dir(tmp_path / "reports"))


def test_compose_campaign_with_two_workers(
    engine: Podman, image: str, stages: Stages, campaign: Campaign
) -> None:
    project = f"llmloadct{uuid.uuid4().hex[:6]}"
    env = {
        **engine.env,
        "LLMLOAD_IMAGE": image,
        "LLMLOAD_STORE_ACCESS_KEY": ACCESS_KEY,
        "LLMLOAD_STORE_SECRET_KEY": SECRET_KEY,
        "LLMLOAD_STORE_HOST_PORT": str(free_port()),
        "LLMLOAD_WORKERS": str(WORKERS),
        "LLMLOAD_RUN_ID": campaign.run_id,
        "LLMLOAD_TRUTH_DIR": str(campaign.truth_dir),
        "LLMLOAD_REPORTS_DIR": str(campaign.reports),
        # the same campaign (the compose file sets no cold requests: llmload's default, 3)
        **{k.replace("LOCUST_", "LLMLOAD_"): v for k, v in CAMPAIGN.items()},
    }
    compose = [_podman_compose(), "--in-pod", "false", "-p", project,
               "-f", str(ROOT / "infra" / "compose" / "compose.yaml"),
               "-f", str(Path(__file__).parent / "compose.truth.yaml")]  # fmt: skip

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([*compose, *args], env=env, capture_output=True, text=True,
                             timeout=timeout)  # fmt: skip
        assert out.returncode == 0, f"{args}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
        return out

    try:
        with stages("compose: up (store, sim, master, 2 workers)"):
            run("--profile", "sim", "up", "-d", "--scale", f"worker={WORKERS}")
            workers = [f"{project}_worker_{i + 1}" for i in range(WORKERS)]
            hosts = dict(_address(engine, w) for w in workers)  # while they run
        with stages("compose: the campaign, to the master's exit"):
            _wait_exit(engine, f"{project}_master_1")
        with stages("compose: llmload report"):
            run("--profile", "report", "run", "--rm", "report", campaign.uri,
                "--out", f"/reports/{campaign.run_id}", "--no-html")  # fmt: skip
        rows = campaign.check_report()
        assert_workers_apart(rows, hosts)
    finally:
        _save_logs(engine, project, campaign.reports.parent / "logs")
        with stages("compose: down"):
            subprocess.run([*compose, "--profile", "sim", "--profile", "report", "down",
                            "--volumes", "-t", "5"],
                           env=env, capture_output=True, timeout=180)  # fmt: skip
            # what `down` may leave when `up` failed half-way
            for cid in engine.lines("ps", "-a", "-q", "--filter",
                                    f"label=io.podman.compose.project={project}"):  # fmt: skip
                engine.run("rm", "-f", cid, check=False)
            engine.run("network", "rm", "-f", f"{project}_llmload", check=False)
            engine.run("volume", "rm", "-f", f"{project}_store-data", check=False)


def test_kube_play_campaign_with_two_workers(
    engine: Podman, image: str, stages: Stages, campaign: Campaign, tmp_path: Path
) -> None:
    network = f"llmloadct-kube-{uuid.uuid4().hex[:6]}"
    docs = render(
        image=image,
        workers=WORKERS,
        secrets={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
        campaign={**CAMPAIGN, "LOCUST_RUN_ID": campaign.run_id},
        sim_volume=(str(campaign.truth_dir), "/truth"),
    )
    # podman 4.3 stores a played Secret as it is but reads a secret back as JSON of base64
    # values: the Secret goes in as a podman secret of that form instead
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    (tmp_path / "secret.json").write_text(json.dumps(secret["data"]))
    played = tmp_path / "llmload-kube.yaml"
    played.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] != "Secret"]))
    s3_env = [
        f"AWS_ACCESS_KEY_ID={ACCESS_KEY}",
        f"AWS_SECRET_ACCESS_KEY={SECRET_KEY}",
        "AWS_ENDPOINT_URL_S3=http://llmload-store:8333",
        "LLMLOAD_S3_ADDRESSING=path",
    ]
    try:
        with stages("kube play: pods (store, sim, master, 2 workers)"):
            engine.run("network", "create", network)
            engine.run(
                "secret", "create", secret["metadata"]["name"], str(tmp_path / "secret.json")
            )
            engine.run("kube", "play", "--network", network, str(played), timeout=300)
        with stages("kube play: the campaign, to the master's exit"):
            _wait_exit(engine, "llmload-master-master")
        with stages("kube play: llmload report"):
            engine.run(
                "run", "--rm", "--network", network, "-v", f"{campaign.reports}:/reports",
                *(a for e in s3_env for a in ("-e", e)), "--entrypoint", "llmload", image,
                "report", campaign.uri, "--out", f"/reports/{campaign.run_id}", "--no-html",
                timeout=300,
            )  # fmt: skip
        rows = campaign.check_report()
        infra = {
            pod: engine.run("pod", "inspect", pod, "--format", "{{.InfraContainerID}}").stdout
            for pod in (f"llmload-worker-{i}" for i in range(WORKERS))
        }
        hosts = {pod: _address(engine, cid.strip())[1] for pod, cid in infra.items()}
        # the pods' names are their hosts' names; the workers reached the master by its
        # name (the Service's, LOCUST_MASTER_NODE_HOST=llmload-master) on the network
        assert_workers_apart(rows, hosts)
    finally:
        _save_logs(engine, "llmload-", campaign.reports.parent / "logs")
        with stages("kube play: down"):
            engine.run("kube", "down", str(played), check=False, timeout=180)
            engine.run("secret", "rm", secret["metadata"]["name"], check=False)
            engine.run("network", "rm", "-f", network, check=False)
