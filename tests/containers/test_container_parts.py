"""What the container deployments rely on that needs no container engine (run by `make test`):
the store wait of infra/containers/bucket.py against a real SeaweedFS, and the rendering of
infra/k8s for `podman kube play` (tests/containers/kube.py)."""

from __future__ import annotations

import time

import pytest

from analysis.kernel.storage import S3Store
from infra.containers.bucket import ensure_bucket, main
from infra.ports import free_port
from tests.containers.kube import COMPONENT, render
from tests.support.store import S3Target


def test_a_missing_bucket_is_created(s3_target: S3Target) -> None:
    bucket = f"{s3_target.bucket}-new"
    assert ensure_bucket(S3Store(bucket, "runs", "path"), timeout=10) is None
    assert s3_target.client().head_bucket(Bucket=bucket)
    # an existing bucket: at once, from the command line too
    assert main(["--events-uri", f"s3://{bucket}/runs", "--timeout", "10"]) == 0


def test_an_unreachable_store_is_given_up_in_time(
    s3_target: S3Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    start = time.monotonic()
    why = ensure_bucket(S3Store(s3_target.bucket, "runs", "path"), timeout=1.5, poll=0.2)
    assert why and "not reachable after 2 s" in why and "EndpointConnectionError" in why
    assert time.monotonic() - start < 10


def test_a_local_events_uri_needs_no_wait() -> None:
    assert main(["--events-uri", "file:///tmp/runs"]) == 0


def test_the_k8s_manifests_render_as_pods_in_play_order() -> None:
    docs = render(
        image="localhost/llmload:test",
        workers=3,
        secrets={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"},
        campaign={"LOCUST_STEPS": "1"},
        sim_volume=("/host/truth", "/truth"),
    )
    kinds = [d["kind"] for d in docs]
    assert "Service" not in kinds and "NetworkPolicy" not in kinds
    pods = [d for d in docs if d["kind"] == "Pod"]
    # named after their Services (their DNS names), the store and simulator first
    assert [p["metadata"]["name"] for p in pods] == [
        "llmload-store", "llmload-sim", "llmload-master",
        "llmload-worker-0", "llmload-worker-1", "llmload-worker-2",
    ]  # fmt: skip
    for pod in pods:
        for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
            assert container["image"] == "localhost/llmload:test"
    (master,) = [p for p in pods if p["metadata"]["labels"][COMPONENT] == "master"]
    env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
    assert env["LOCUST_EXPECT_WORKERS"] == "3"
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config["data"]["LOCUST_STEPS"] == "1"
    assert config["data"]["AWS_ENDPOINT_URL_S3"] == "http://llmload-store:8333"
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert set(secret["data"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY"}
