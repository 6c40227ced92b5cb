#!/usr/bin/env bash
# Debian packages that the tests drive for real: openssh-server (sshd on loopback and in
# network namespaces), patch (the Turing patches), iproute2 (ip netns, tc), util-linux
# (unshare: a private filesystem per lab host), postgresql (the cluster's Prefect
# database), chromium (the browser test of the Prefect UI, driven by Playwright). Idempotent.
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
command -v patch >/dev/null 2>&1 || need+=(patch)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "note: not root; the tests that need ${need[*]} will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
