#!/usr/bin/env bash
# apt_install.sh PACKAGE...: `apt-get update` then `apt-get install` of the packages (no
# recommends), waiting while another apt holds its locks: .ci/run installs the containers'
# host packages beside `make setup`'s Chromium, and `apt-get update` fails at once on a
# held lock (DPkg::Lock::Timeout covers dpkg's lock only). Any other failure is returned
# as is, at once. Root, or sudo, as the callers check.
set -uo pipefail
SUDO=""
[ "$(id -u)" = "0" ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
LOCK_WAIT_S=${APT_LOCK_WAIT_S:-900}

apt_get() {  # apt_get ARGS...: apt-get ARGS, tried again while a lock is held elsewhere
    local log deadline=$((SECONDS + LOCK_WAIT_S))
    log=$(mktemp)
    while true; do
        if $SUDO apt-get -o DPkg::Lock::Timeout=60 "$@" >"$log" 2>&1; then
            rm -f "$log"
            return 0
        fi
        if grep -q "Could not get lock\|Unable to lock\|Unable to acquire the dpkg frontend lock" "$log" \
            && ((SECONDS < deadline)); then
            sleep 3
            continue
        fi
        cat "$log" >&2
        rm -f "$log"
        return 1
    done
}

apt_get update -qq && apt_get install -y -qq --no-install-recommends "$@"
