#!/usr/bin/env bash
# Install the Prometheus server (Debian package `prometheus`) for the metrics integration test and local use.
# Idempotent: does nothing when a `prometheus` binary is already on PATH. Never starts the Debian service
# (the test starts its own loopback-only instance). Exit status 0 = prometheus is installed.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
    echo "prometheus already installed: $(command -v prometheus)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "install_prometheus.sh: need root (or sudo) to apt-get install prometheus" >&2; exit 1; fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_prometheus.sh: apt-get not found; install Prometheus >= 2.x by hand" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Keep the package's init scripts from starting a system-wide Prometheus (containers, CI runners).
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
    trap '$SUDO rm -f "$POLICY"' EXIT
fi

install() { $SUDO apt-get install -y --no-install-recommends prometheus; }
if ! install; then
    $SUDO apt-get update
    install
fi
command -v prometheus
prometheus --version 2>&1 | head -1
