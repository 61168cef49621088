#!/usr/bin/env bash
# Installs the build and test dependencies on a fresh Debian machine. Each
# .ci/deps.d/*.sh lists packages of one part; the script is idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=()
for f in .ci/deps.d/*.pkgs; do
  [ -e "$f" ] || continue
  while read -r p _; do [[ -n "$p" && "$p" != \#* ]] && pkgs+=("$p"); done < "$f"
done
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v go >/dev/null || { echo "Go 1.26 is required (https://go.dev/dl)"; exit 1; }
go mod download
