#!/usr/bin/env bash
# What `make test-containers` needs on a Debian machine, installed when missing (idempotent):
# podman with runc, netavark and aardvark-dns (networks with DNS), iptables (netavark's
# firewall), catatonit (a pod's infra process), debootstrap (the base image); podman-compose
# (PyPI) into the venv given as $1. Where they cannot be installed (not Debian, not root),
# it says so and exits 0: the tests then skip with that reason.
set -uo pipefail
VENV_BIN=${1:?usage: setup_host.sh VENV_BIN (or -: the host packages only)}
PODMAN_COMPOSE_VERSION=1.6.0
start=$SECONDS
packages=(podman runc netavark aardvark-dns iptables catatonit debootstrap)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "test-containers: installing ${missing[*]}"
        bash "$(dirname "$0")/../../infra/apt_install.sh" "${missing[@]}" >/dev/null \
            || echo "test-containers: apt-get could not install ${missing[*]}"
    else
        echo "test-containers: cannot install ${missing[*]} (needs root and apt-get)"
    fi
fi
if [ "$VENV_BIN" != "-" ] && [ ! -x "$VENV_BIN/podman-compose" ]; then  # -: no venv yet
    "$VENV_BIN/python" -m pip install --quiet --disable-pip-version-check \
        "podman-compose==$PODMAN_COMPOSE_VERSION" \
        || echo "test-containers: pip could not install podman-compose"
fi
echo "test-containers: host set up in $((SECONDS - start)) s"
