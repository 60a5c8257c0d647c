"""infra/k8s rendered for `podman kube play`: what a cluster does that podman 4.3 does not.

    docs = render(image="localhost/llmload:x", workers=2, secrets={...}, campaign={...},
                  sim_volume=("/host/truth", "/truth"))
    path.write_text(yaml.safe_dump_all(docs))

The kustomization's resources, as kustomize would list them, with the substitutions podman
needs (docs/campaigns.md, "Kubernetes manifests under podman"):

- a Job or Deployment becomes Pods (podman 4.3 plays neither a Job nor more than one
  replica): each named after the Service that selects it, since a pod's name is its DNS
  name on a podman network; the workers, selected by no Service, `llmload-worker-<i>`;
- Services and the NetworkPolicy are left out (no virtual IPs, no policy under podman: the
  pod names above stand for the Services);
- the Secret is made from the example's keys with the test's values; the ConfigMap keeps
  its keys, with the test's campaign settings over them;
- the image name is the kustomization's `images` rule applied to the test's image;
- the pods come in the order store, simulator, master, workers: podman plays them one
  after another and waits for each init container (the master's waits for the store);
- the simulator keeps its truth log in a host folder (an extra hostPath volume).
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[2]
K8S = ROOT / "infra" / "k8s"
DROPPED_KINDS = ("Service", "NetworkPolicy")


def _load(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return doc


def kustomization() -> dict[str, Any]:
    return _load("kustomization.yaml")


def resources() -> list[dict[str, Any]]:
    return [_load(name) for name in kustomization()["resources"]]


def _service_names(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    return [(d["metadata"]["name"], d["spec"]["selector"]) for d in docs if d["kind"] == "Service"]


def _pod(name: str, template: dict[str, Any], image: str) -> dict[str, Any]:
    spec = copy.deepcopy(template["spec"])
    images = {i["name"]: i for i in kustomization().get("images", [])}
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        repo = container["image"].split(":")[0]
        if repo in images:  # the kustomization's `images` rule, pointed at the test's image
            container["image"] = image
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(template["metadata"]["labels"])},
        "spec": spec,
    }


def render(
    *,
    image: str,
    workers: int,
    secrets: dict[str, str],
    campaign: dict[str, str],
    sim_volume: tuple[str, str],
) -> list[dict[str, Any]]:
    docs = resources()
    services = _service_names(docs)
    out: list[dict[str, Any]] = []
    (example,) = [d for d in yaml.safe_load_all((K8S / "llmload-secret.example.yaml").read_text())]
    secret = copy.deepcopy(example)
    assert set(secrets) <= set(secret["stringData"]), "the example names every key"
    # podman 4.3 reads `data` (base64), not `stringData`
    values = {k: secrets.get(k, "") for k in secret.pop("stringData")}
    secret["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
    out.append(secret)
    for doc in docs:
        kind = doc["kind"]
        if kind in DROPPED_KINDS:
            continue
        if kind == "ConfigMap":
            doc = copy.deepcopy(doc)
            doc["data"].update(campaign)
            out.append(doc)
            continue
        assert kind in ("Job", "Deployment"), f"{kind}: no rendering for podman"
        template = doc["spec"]["template"]
        labels = template["metadata"]["labels"]
        named = [n for n, sel in services if sel.items() <= labels.items()]
        if named:
            assert doc["spec"].get("replicas", 1) == 1, f"{named[0]}: one pod per Service name"
            pods = [_pod(named[0], template, image)]
        else:
            pods = [_pod(f"{doc['metadata']['name']}-{i}", template, image) for i in range(workers)]
        out.extend(pods)
    out.sort(key=_play_order)
    for pod in out:
        if pod["kind"] == "Pod" and pod["metadata"]["labels"].get(COMPONENT) == "master":
            (master,) = pod["spec"]["containers"]
            for env in master["env"]:
                if env["name"] == "LOCUST_EXPECT_WORKERS":
                    env["value"] = str(workers)
        if pod["kind"] == "Pod" and pod["metadata"]["labels"].get(COMPONENT) == "sim":
            host_dir, mount = sim_volume
            (sim,) = pod["spec"]["containers"]
            sim.setdefault("env", []).append(
                {"name": "LLMLOAD_SIM_TRUTH_LOG", "value": f"{mount}/truth.jsonl"}
            )
            sim.setdefault("volumeMounts", []).append({"name": "truth", "mountPath": mount})
            pod["spec"].setdefault("volumes", []).append(
                {"name": "truth", "hostPath": {"path": host_dir, "type": "Directory"}}
            )
    return out


COMPONENT = "app.kubernetes.io/component"
# podman plays the pods one after another and waits for each init container to finish: the
# master's (which waits for the store) must come after the store.
PLAY_ORDER = ("store", "sim", "master", "worker")


def _play_order(doc: dict[str, Any]) -> int:
    if doc["kind"] != "Pod":
        return -1
    component = doc["metadata"]["labels"].get(COMPONENT, "")
    return PLAY_ORDER.index(component) if component in PLAY_ORDER else len(PLAY_ORDER)
