"""Podman for the container tests: its configuration, the Debian base, llmload's image, cleanup.

    engine = Podman()                        # CONTAINERS_CONF: tests/containers/containers.conf
    engine.run("ps", "-a")                   # CompletedProcess; raises on failure
    base, cached = engine.base_image(work)   # localhost/llmload-debian-base:bookworm
    engine.build(base, "localhost/llmload-ct:abc")
    before = engine.inventory(); ...; engine.leftovers(before)   # what a test left behind

Podman runs here as root with Debian's runc: the configuration file drops the default
ulimits (above this machine's hard limits: runc refuses to start) and picks runc (crun
refuses the kernel's hybrid cgroups) and netavark (DNS between containers, by name).
No image can be pulled from a registry: the base is a Debian made by debootstrap from the
mirror apt already uses, with this machine's CA bundle (so pip in a build trusts what the
host trusts), imported once and kept between runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).parents[2]
CONF = Path(__file__).parent / "containers.conf"
BASE_IMAGE = "localhost/llmload-debian-base:bookworm"
SUITE = "bookworm"
DEFAULT_MIRROR = ""  # none found: debootstrap then picks its own default
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PAUSE_IMAGE = "localhost/podman-pause"  # built by podman itself for a pod's infra container
INVENTORY = {  # what a test may create, and how podman lists it
    "containers": ("ps", "-a", "--format", "{{.ID}} {{.Names}}"),
    "pods": ("pod", "ps", "--format", "{{.ID}} {{.Name}}"),
    "networks": ("network", "ls", "--format", "{{.Name}}"),
    "volumes": ("volume", "ls", "--format", "{{.Name}}"),
    "secrets": ("secret", "ls", "--format", "{{.Name}}"),
    "images": ("images", "-a", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}"),
}


def unavailable() -> str | None:
    """Why no container can run here (one line), or None."""
    if shutil.which("podman") is None:
        return "no container engine: podman is not installed (make test-containers installs it)"
    for tool in ("runc", "debootstrap"):
        if shutil.which(tool) is None:
            return (
                f"no container engine: {tool} is not installed (make test-containers installs it)"
            )
    return None


class Podman:
    """podman with the tests' configuration (see the module docstring)."""

    def __init__(self) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(CONF)}

    def run(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            ["podman", *args],
            env=self.env,
            capture_output=True,
            text=stdin is None,
            input=stdin,
            timeout=timeout,
        )
        if isinstance(out.stdout, bytes):  # fed bytes: give text back
            out = subprocess.CompletedProcess(
                out.args, out.returncode, out.stdout.decode(errors="replace"),
                out.stderr.decode(errors="replace"),
            )  # fmt: skip
        if check and out.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} exited {out.returncode}:\n"
                f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            )
        return out

    def lines(self, *args: str) -> list[str]:
        return [line for line in self.run(*args).stdout.splitlines() if line.strip()]

    # -- the base image ----------------------------------------------------------------------

    def base_image(self, work: Path) -> tuple[str, bool]:
        """The Debian base (made when missing); (name, whether it was cached)."""
        if self.run("image", "exists", BASE_IMAGE, check=False).returncode == 0:
            return BASE_IMAGE, True
        rootfs = Path(tempfile.mkdtemp(prefix="llmload-rootfs-", dir=work))
        mirror = apt_mirror()
        try:
            made = subprocess.run(
                ["debootstrap", "--variant=minbase", "--include=python3,python3-venv", SUITE,
                 str(rootfs), *([mirror] if mirror else [])],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert made.returncode == 0, f"debootstrap failed:\n{made.stdout[-2000:]}{made.stderr}"
            if CA_BUNDLE.is_file():  # this machine's trust, for pip's downloads in a build
                shutil.copyfile(CA_BUNDLE, rootfs / CA_BUNDLE.relative_to("/"))
            tar = subprocess.run(
                ["tar", "-C", str(rootfs), "-c", "."], capture_output=True, timeout=300, check=True
            )
            self.run("import", "-q", "-", BASE_IMAGE, stdin=tar.stdout, timeout=300)
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)
        return BASE_IMAGE, False

    def build(self, base: str, tag: str) -> None:
        """llmload's image from infra/docker/Dockerfile on `base`; no intermediate images."""
        self.run(
            "build", "--layers=false", "--pull=never", "--build-arg", f"BASE_IMAGE={base}",
            "-f", str(ROOT / "infra" / "docker" / "Dockerfile"), "-t", tag, str(ROOT),
            timeout=900,
        )  # fmt: skip

    # -- what a test made ----------------------------------------------------------------------

    def inventory(self) -> dict[str, set[str]]:
        return {kind: set(self.lines(*args)) for kind, args in INVENTORY.items()}

    def leftovers(self, before: dict[str, set[str]]) -> dict[str, set[str]]:
        """What exists now and did not before, by kind (empty sets dropped)."""
        now = self.inventory()
        return {kind: now[kind] - before[kind] for kind in now if now[kind] - before[kind]}

    def remove_new_pause_image(self, before: dict[str, set[str]]) -> None:
        """podman builds its pause image for the first pod; removed if this run made it."""
        for line in self.inventory()["images"] - before["images"]:
            image_id, name = line.split(" ", 1)
            if name.startswith(f"{PAUSE_IMAGE}:"):
                self.run("rmi", image_id, check=False)


def apt_mirror() -> str:
    """The Debian mirror apt uses here (deb822 sources or sources.list), else "" (debootstrap's
    own default)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file() or path.suffix not in ("", ".list", ".sources"):
            continue
        text = path.read_text(errors="replace")
        for url in re.findall(r"^(?:URIs:|deb)\s+(\S+)", text, flags=re.MULTILINE):
            if url.rstrip("/").endswith("/debian"):  # not debian-security
                return url
    return DEFAULT_MIRROR


class Stages:
    """How long each stage took, in order, for the summary at the end."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []

    @contextmanager
    def __call__(self, name: str) -> Iterator[list[str]]:
        """Times the block; what it appends to the list it gets is shown after the name."""
        start, notes = time.monotonic(), []
        try:
            yield notes
        finally:
            label = f"{name} ({', '.join(notes)})" if notes else name
            self.times.append((label, time.monotonic() - start))

    def lines(self) -> list[str]:
        total = sum(seconds for _, seconds in self.times)
        return [f"  {name:<48} {seconds:6.1f} s" for name, seconds in self.times] + [
            f"  {'total':<48} {total:6.1f} s"
        ]


if __name__ == "__main__":  # `python3 tests/containers/engine.py`: the base, made ahead (.ci/run)
    if (why := unavailable()) is not None:
        raise SystemExit(f"containers: no base image made: {why}")
    with tempfile.TemporaryDirectory(prefix="llmload-base-") as tmp:
        started = time.monotonic()
        name, was_cached = Podman().base_image(Path(tmp))
        print(f"containers: {name} {'was there' if was_cached else 'made'} "
              f"in {time.monotonic() - started:.0f} s")  # fmt: skip
