"""Deployment files (infra/docker, infra/compose, infra/k8s): parse, schema-validate, conventions.

Offline: the compose-spec schema comes from check-jsonschema's vendored copy, the Kubernetes
schemas from kubernetes-validate (strict: unknown fields are errors). The Dockerfile is
checked for its pinned Locust version and its paths. That the files run, under podman:
tests/containers (`make test-containers`).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import posixpath
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.version import Version

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "infra" / "docker" / "Dockerfile"
COMPOSE = ROOT / "infra" / "compose" / "compose.yaml"
K8S = ROOT / "infra" / "k8s"
# Oldest and newest Kubernetes minor versions the manifests must be valid for.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
# Resource files: `<component>-<kind>.yaml`; examples (not applied): `<component>-<kind>.example.yaml`.
RESOURCE_NAME = re.compile(
    r"^(?P<component>[a-z0-9]+)-(?P<kind>[a-z]+)(?P<example>\.example)?\.yaml$"
)
SECRET_ENV = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD)", re.IGNORECASE)


def _load(path: Path) -> list[Any]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def _k8s_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _resources() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, _load(p)[0]) for p in _k8s_files()]


def _containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    spec = resource.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def _compose() -> dict[str, Any]:
    (doc,) = _load(COMPOSE)
    return doc


def _compose_schema() -> dict[str, Any]:
    spec = importlib.util.find_spec("check_jsonschema")  # located, not imported
    assert spec is not None and spec.origin is not None, "dev dependency check-jsonschema missing"
    path = Path(spec.origin).parent / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(path.read_text())


def _schema_errors(schema: dict[str, Any], doc: Any) -> list[str]:
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


@cache
def _locust_env_vars() -> frozenset[str]:
    """Every LOCUST_* variable Locust and llmload read (a subprocess: importing locust patches)."""
    code = (
        "from locust import argument_parser as ap\n"
        "from locustfiles.options import options\n"
        "p = ap.get_empty_argument_parser(); ap.setup_parser_arguments(p); options.add_arguments(p)\n"
        "print(' '.join(a.env_var for a in p._actions if getattr(a, 'env_var', None)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return frozenset(out.stdout.split())


# --- every YAML parses ------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [COMPOSE, *sorted(K8S.glob("*.yaml"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_yaml_parses(path: Path) -> None:
    assert _load(path), f"{path} holds no document"


# --- compose -------------------------------------------------------------------------------


def test_compose_matches_the_compose_spec_schema() -> None:
    assert _schema_errors(_compose_schema(), _compose()) == []


def test_compose_schema_rejects_unknown_fields() -> None:
    # The check above means something only if the schema is strict.
    bad = {"services": {"worker": {"image": "x", "imagee": "typo"}}}
    assert _schema_errors(_compose_schema(), bad)


def test_compose_services_and_worker_scaling() -> None:
    services = _compose()["services"]
    assert {"store", "createbucket", "sim", "master", "worker", "report"} <= set(services)
    assert services["sim"]["profiles"] == ["sim"]
    assert services["report"]["profiles"] == ["report"]
    # every service runs llmload's own image: no other image to pull
    assert {s["image"] for s in services.values()} == {"${LLMLOAD_IMAGE:-llmload:0.1.0}"}
    assert services["store"]["entrypoint"] == ["weed"]
    assert "-ip.bind=0.0.0.0" in services["store"]["command"]
    assert services["createbucket"]["entrypoint"][-1] == "infra.containers.bucket"
    # podman 4.3 cannot start a container whose dependencies have dependencies: only the
    # master depends on others, and those on nothing
    for name, service in services.items():
        if name != "master":
            assert "depends_on" not in service, f"{name}: only the master has dependencies"
    assert services["master"]["environment"]["LOCUST_WAIT_READY"]
    worker = services["worker"]
    assert "container_name" not in worker, "a fixed name defeats --scale worker=N"
    assert not worker.get("ports"), "a published port defeats --scale worker=N"
    assert worker["environment"]["LOCUST_MODE_WORKER"] == "true"
    assert worker["environment"]["LOCUST_MASTER_NODE_HOST"] == "master"
    master = services["master"]["environment"]
    assert master["LOCUST_MODE_MASTER"] == "true" and master["LOCUST_HEADLESS"] == "true"
    assert "LOCUST_EXPECT_WORKERS" in master
    assert master["LOCUST_EVENTS_URI"].startswith("s3://")
    # Failed requests are data in the report: the master exits 0, as `llmload campaign`'s
    assert master["LOCUST_EXIT_CODE_ON_ERROR"] == "0"


def test_compose_master_port_5557_is_not_published() -> None:
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            text = str(port if not isinstance(port, dict) else port.get("target"))
            assert "5557" not in text, f"{name} publishes 5557 (no authentication)"
            # Whatever is published is bound to loopback only.
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)
    assert "5557" in [str(p) for p in _compose()["services"]["master"]["expose"]]


def test_compose_credentials_come_from_variables() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_ENV.search(key) and key != "LOCUST_API_KEY_ENV":
                assert re.fullmatch(r"\$\{[A-Z0-9_]+(:[?-][^}]*)?\}", str(value)), (name, key)
    assert services["store"]["environment"]["AWS_SECRET_ACCESS_KEY"].startswith(
        "${LLMLOAD_STORE_SECRET_KEY:?"
    )


def test_compose_build_points_at_the_dockerfile() -> None:
    build = _compose()["services"]["master"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE


def test_compose_env_example_has_placeholders_only() -> None:
    example = COMPOSE.parent / "llmload.env.example"
    values = dict(
        line.split("=", 1)
        for line in example.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    assert values["LLMLOAD_STORE_SECRET_KEY"].startswith("change-me")
    assert "OPENAI_API_KEY" not in values
    # Every variable the compose file requires (${NAME:?...}) is in the example.
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", COMPOSE.read_text()))
    assert required <= set(values)


# --- kubernetes ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", _k8s_files(), ids=lambda p: p.name)
def test_k8s_manifest_matches_its_schema(path: Path) -> None:
    (resource,) = _load(path)
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name} (k8s {version}) {list(exc.absolute_path)}: {exc.message}")


def test_k8s_schema_rejects_unknown_fields() -> None:
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spek": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("path", _k8s_files(), ids=lambda p: p.name)
def test_k8s_one_resource_per_file_named_component_kind(path: Path) -> None:
    docs = _load(path)
    assert len(docs) == 1, f"{path.name} holds {len(docs)} resources"
    match = RESOURCE_NAME.match(path.name)
    assert match, f"{path.name} is not <component>-<kind>.yaml"
    assert match["kind"] == docs[0]["kind"].lower()
    labels = docs[0]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "llmload"


def test_kustomization_lists_every_resource_but_the_examples() -> None:
    (kustomization,) = _load(K8S / "kustomization.yaml")
    listed = kustomization["resources"]
    expected = [p.name for p in _k8s_files() if ".example." not in p.name]
    assert sorted(listed) == sorted(expected)
    assert len(set(listed)) == len(listed)


def test_k8s_no_literal_secrets() -> None:
    for path, resource in _resources():
        if resource["kind"] == "Secret":
            assert ".example." in path.name, f"{path.name}: ship Secrets as examples only"
            values = {**resource.get("stringData", {}), **resource.get("data", {})}
            assert set(values.values()) == {"REPLACE_ME"}, f"{path.name}: placeholders only"
            continue
        if resource["kind"] == "ConfigMap":
            for key in resource["data"]:
                assert not SECRET_ENV.search(key) or key == "LOCUST_API_KEY_ENV", (path, key)
        for container in _containers(resource):
            for env in container.get("env", []):
                if SECRET_ENV.search(env["name"]):
                    assert "value" not in env, f"{path.name}: {env['name']} has a literal value"
                    assert "secretKeyRef" in env["valueFrom"], (path.name, env["name"])
            for source in container.get("envFrom", []):
                assert set(source) <= {"configMapRef", "secretRef", "prefix"}


def test_k8s_secret_references_use_the_documented_keys() -> None:
    (example,) = _load(K8S / "llmload-secret.example.yaml")
    keys = set(example["stringData"])
    for _path, resource in _resources():
        for container in _containers(resource):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == example["metadata"]["name"]
                    assert ref["key"] in keys


def test_k8s_pods_run_as_non_root_without_privileges() -> None:
    for path, resource in _resources():
        if resource["kind"] not in ("Job", "Deployment"):
            continue
        pod = resource["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, path.name
        assert pod["automountServiceAccountToken"] is False, path.name
        for container in _containers(resource):
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, path.name
            assert ctx["capabilities"]["drop"] == ["ALL"], path.name
            assert "memory" in container["resources"]["limits"], path.name
            assert "cpu" in container["resources"]["requests"], path.name


def test_k8s_master_job_completes_when_requests_failed() -> None:
    # Failed requests are data in the report; exit status 1 would fail the Job (backoffLimit
    # 0) and `kubectl wait --for=condition=complete` would never return.
    (job,) = _load(K8S / "master-job.yaml")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LOCUST_EXIT_CODE_ON_ERROR"] == "0"


def test_k8s_master_reachable_only_by_workers_on_5557() -> None:
    (service,) = _load(K8S / "master-service.yaml")
    assert service["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in service["spec"]["ports"]] == [5557]
    (policy,) = _load(K8S / "master-networkpolicy.yaml")
    assert policy["spec"]["podSelector"]["matchLabels"] == service["spec"]["selector"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    assert rule["ports"] == [{"protocol": "TCP", "port": 5557}]
    (workers,) = _load(K8S / "worker-deployment.yaml")
    assert workers["spec"]["template"]["metadata"]["labels"] == {
        **source["podSelector"]["matchLabels"]
    }


# --- LOCUST_* settings are real options ----------------------------------------------------


def test_every_locust_variable_is_a_known_option() -> None:
    known = _locust_env_vars()
    assert "LOCUST_WORKLOAD" in known and "LOCUST_MODE_MASTER" in known
    used: set[str] = set()
    for service in _compose()["services"].values():
        used |= {k for k in service.get("environment") or {} if k.startswith("LOCUST_")}
    for _path, resource in _resources():
        if resource["kind"] == "ConfigMap":
            used |= {k for k in resource["data"] if k.startswith("LOCUST_")}
        for container in _containers(resource):
            used |= {e["name"] for e in container.get("env", []) if e["name"].startswith("LOCUST_")}
    env = " ".join(rest for op, rest in _dockerfile_instructions() if op == "ENV")
    used |= set(re.findall(r"\b(LOCUST_[A-Z_]+)=", env))
    assert used - known == set()


# --- Dockerfile ----------------------------------------------------------------------------


def _dockerfile_instructions(text: str | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile (or of `text`), continuation lines joined."""
    text = (DOCKERFILE.read_text() if text is None else text).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _installed_locust_version() -> str:
    from importlib.metadata import version

    return version("locust")


def _locust_lower_bound() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"locust>=([0-9.]+)"', text)
    assert match
    return match[1]


def _build_args() -> dict[str, str]:
    """The Dockerfile's ARG defaults."""
    return dict(
        rest.split("=", 1) for op, rest in _dockerfile_instructions() if op == "ARG" and "=" in rest
    )


def test_dockerfile_pins_the_tested_locust_version() -> None:
    (base,) = [rest for op, rest in _dockerfile_instructions() if op == "FROM"]
    assert base == "${BASE_IMAGE}", (
        "the base is a build argument (a local base where no registry is)"
    )
    args = _build_args()
    match = re.fullmatch(r"locustio/locust:(\d+\.\d+\.\d+)", args["BASE_IMAGE"])
    assert match, f"BASE_IMAGE={args['BASE_IMAGE']}: pin an exact locustio/locust version"
    # on another base, pip installs Locust at LOCUST_VERSION: the same as the official image's
    assert args["LOCUST_VERSION"] == match[1]
    pinned, installed = match[1], _installed_locust_version()
    assert Version(pinned) >= Version(_locust_lower_bound())
    if pinned != installed and Version(installed) == Version(_locust_lower_bound()):
        pytest.skip(f"lowest-versions environment (locust {installed}); the image pins {pinned}")
    assert pinned == installed, f"image pins locust {pinned}, the tests run locust {installed}"


def test_dockerfile_copies_existing_paths_and_sets_the_locustfile() -> None:
    instructions = _dockerfile_instructions()
    copies = [rest.split()[:-1] for op, rest in instructions if op == "COPY"]
    sources = [s for srcs in copies for s in srcs if not s.startswith("--")]
    assert {"pyproject.toml", "README.md", "locustfiles/", "analysis/", "infra/"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
        assert not _dockerignored(source.rstrip("/")), f"COPY {source} is excluded by .dockerignore"
    assert (ROOT / "locustfiles" / "chat.py").is_file()  # what /opt/llmload/chat.py links to
    env = " ".join(rest for op, rest in instructions if op == "ENV")
    assert "LOCUST_LOCUSTFILE=/opt/llmload/chat.py" in env
    users = [rest for op, rest in instructions if op == "USER"]
    assert users[-1] == "locust", "the image must end as the base image's non-root user"
    assert ("ENTRYPOINT", '["locust"]') in instructions


# The image is built from the build context and package indexes only: the base image, the
# repository's own files (COPY) and `pip install .` with its dependencies. Anything fetched
# from elsewhere (a script, an archive, a clone) would be code nobody reviewed here.
DOWNLOADER = re.compile(
    r"\b(curl|wget|aria2c|svn)\b|\bgit\s+(clone|fetch|pull|submodule)\b|\bgit\+|\b[a-z][a-z0-9+.-]*://",
    re.IGNORECASE,
)
# `pip install` options that take a value (the value is not a requirement).
PIP_VALUE_OPTIONS = frozenset(
    {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url",
     "-f", "--find-links", "-t", "--target", "--prefix", "--root", "--src"}
)  # fmt: skip


def _download_steps(text: str) -> list[str]:
    """Instructions that fetch or unpack code from elsewhere: ADD (URLs, git, archives), a
    download tool or a URL in RUN, COPY --from another image."""
    stages = {
        rest.split()[-1].lower()
        for op, rest in _dockerfile_instructions(text)
        if op == "FROM" and len(rest.split()) == 3 and rest.split()[1].upper() == "AS"
    }
    bad = []
    for op, rest in _dockerfile_instructions(text):
        if op == "ADD":  # fetches URLs and git repositories, unpacks archives: COPY instead
            bad.append(f"ADD {rest}")
        elif op == "RUN" and DOWNLOADER.search(rest):
            bad.append(f"RUN {rest}")
        elif op == "COPY":
            froms = re.findall(r"--from=(\S+)", rest)
            if any(f.lower() not in stages for f in froms):  # another image's files
                bad.append(f"COPY {rest}")
    return bad


def _shell_commands(run: str) -> list[list[str]]:
    """The simple commands of a RUN line (split at && || ; | &, quotes respected)."""
    lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|", "&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _pip_install_targets(run: str) -> list[str]:
    """What each `pip install` of a RUN line installs (`-e X` kept whole)."""
    targets = []
    for words in _shell_commands(run):
        for i, word in enumerate(words[:-1]):
            if not (re.fullmatch(r"(.*/)?pip3?(\.\d+)?", word) and words[i + 1] == "install"):
                continue
            rest = iter(words[i + 2 :])
            for arg in rest:
                if arg in PIP_VALUE_OPTIONS:
                    next(rest, None)
                elif arg in ("-e", "--editable"):
                    targets.append(f"-e {next(rest, '')}")
                elif not arg.startswith("-"):
                    targets.append(arg)
    return targets


def test_dockerfile_downloads_nothing() -> None:
    assert _download_steps(DOCKERFILE.read_text()) == []


@pytest.mark.parametrize(
    "step",
    [
        "RUN curl -fsSL https://example.com/install.sh | sh",
        "RUN wget -q http://example.com/llmload.tar.gz",
        "RUN git clone https://github.com/example/llmload /src",
        "RUN pip install git+https://github.com/example/llmload",
        "RUN pip3 install https://example.com/llmload-0.1.0.whl",
        "RUN apt-get update \\\n && curl -O http://example.com/x",
        "ADD https://example.com/llmload.tar.gz /src/",
        "ADD llmload.tar.gz /src/",
        "COPY --from=example/llmload:latest /src /src",
    ],
)
def test_download_check_catches_downloads(step: str) -> None:
    # The check above means something only if it catches what it is for.
    assert _download_steps(f"FROM locustio/locust:2.47.0\n{step}\n")


def test_pip_install_targets_reads_the_requirements() -> None:
    run = (
        "pip3 install --no-cache-dir -r req.txt . && python -c 'import a; print(1)' "
        "&& python -m pip install -e ./x 'llmload==0.1'"
    )
    assert _pip_install_targets(run) == [".", "-e ./x", "llmload==0.1"]


def test_dockerfile_installs_llmload_from_the_copied_source() -> None:
    instructions = _dockerfile_instructions()
    (install_at,) = [
        i for i, (op, rest) in enumerate(instructions) if op == "RUN" and _pip_install_targets(rest)
    ]
    assert _pip_install_targets(instructions[install_at][1]) == ["."], (
        "the image installs the copied source (`pip install .`), nothing by name or URL"
    )
    workdir, dests, sources = "/", [], set()
    for op, rest in instructions[:install_at]:
        if op == "WORKDIR":
            workdir = posixpath.join(workdir, rest)
        elif op == "COPY":
            *srcs, dest = rest.split()
            dests.append(posixpath.normpath(posixpath.join(workdir, dest)))
            sources |= {s.rstrip("/") for s in srcs if not s.startswith("--")}
    assert dests, "no COPY before `pip install .`"
    for dest in dests:
        assert dest == workdir or dest.startswith(f"{workdir}/"), (
            f"`pip install .` runs in {workdir}, but a COPY lands in {dest}"
        )
    later = [op for op, _ in instructions[install_at:] if op in ("COPY", "ADD")]
    assert not later, "files copied after the install are not in the installed package"
    # Everything the build reads: the project file, its readme, every package it finds.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    needed = {"pyproject.toml", "setup.py", project["project"]["readme"]} | {
        p.rstrip("*") for p in packages
    }
    assert needed <= sources, f"not copied: {sorted(needed - sources)}"


def _dockerignored(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matches a path or its parents."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        candidates = [pat, pat.removeprefix("**/")]
        if any(fnmatch.fnmatchcase(p, c) for p in prefixes for c in candidates):
            ignored = not negate
    return ignored


@pytest.mark.parametrize(
    "path",
    [
        ".git",
        ".venv",
        ".venv-min",
        "runs",
        "tests",
        "llmload.egg-info",
        "locustfiles/request/_ssefast.cpython-311-x86_64-linux-gnu.so",  # built here, for here
    ],
)
def test_dockerignore_keeps_local_state_out(path: str) -> None:
    assert _dockerignored(path)


# --- the in-cluster store and the wait for it ----------------------------------------------


def test_k8s_store_is_where_the_campaign_writes() -> None:
    (config,) = _load(K8S / "campaign-configmap.yaml")
    (service,) = _load(K8S / "store-service.yaml")
    (port,) = service["spec"]["ports"]
    assert config["data"]["AWS_ENDPOINT_URL_S3"] == (
        f"http://{service['metadata']['name']}:{port['port']}"
    )
    (store,) = _load(K8S / "store-deployment.yaml")
    (container,) = _containers(store)
    assert container["command"] == ["weed"] and f"-s3.port={port['port']}" in container["args"]
    assert container["ports"][0]["name"] == port["targetPort"]


def test_the_master_waits_for_the_store_with_a_module_of_the_image() -> None:
    (job,) = _load(K8S / "master-job.yaml")
    (init,) = job["spec"]["template"]["spec"]["initContainers"]
    module = init["command"][init["command"].index("-m") + 1]
    assert module == "infra.containers.bucket"
    assert (ROOT / (module.replace(".", "/") + ".py")).is_file()
    compose = _compose()["services"]["createbucket"]["entrypoint"]
    assert compose[compose.index("-m") + 1] == module
