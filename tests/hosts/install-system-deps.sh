#!/usr/bin/env bash
# System packages the host-level tests need (systemd-nspawn hosts, loop disks, mkfs, rsync).
# Installs only what is missing, only as root; elsewhere it says what the tests will skip.
set -euo pipefail
pkgs=(debootstrap systemd-container xfsprogs e2fsprogs rsync iproute2 openssh-client gdisk parted util-linux kmod qemu-system-x86 qemu-utils patch)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: missing system packages (${missing[*]}); host-level tests will skip" >&2
  exit 0
fi
echo "installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
