#!/usr/bin/env bash
# Debian packages of the sandbox's real node (containerd, runc, CNI plugins, iptables, conntrack,
# and nftables, whose nft removes the iptables tables the node made on a host that had none), of
# the image builds (docker.io's dockerd, debootstrap) and of the llama.cpp build (cmake, g++). Installed only when one is missing; needs root, as the node does.
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins iptables nftables conntrack iproute2 docker.io
  debootstrap cmake g++ make)
missing=()
for package in "${PACKAGES[@]}"; do
  # The status read whole (`| grep -q` under pipefail can fail on the writer's SIGPIPE).
  [[ $(dpkg-query -W -f='${Status}' "$package" 2>/dev/null) == "install ok installed" ]] || missing+=("$package")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "missing Debian packages (run as root to install them): ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
