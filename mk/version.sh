#!/usr/bin/env bash
# mk/version.sh: prints te's version (engine.Version says what it is):
# $TE_VERSION when set; else te.h's ABI version MAJOR.MINOR.0, followed by
# "+g<commit>" (".dirty" when tracked files changed) unless HEAD is tagged
# vMAJOR.MINOR.0 with a clean tree; "+dev" outside a git checkout.
set -euo pipefail
if [ -n "${TE_VERSION:-}" ]; then
  echo "$TE_VERSION"
  exit 0
fi
cd "$(dirname "$0")/.."
major=$(sed -n 's/^#define TE_ABI_VERSION_MAJOR \([0-9][0-9]*\).*/\1/p' include/te.h)
minor=$(sed -n 's/^#define TE_ABI_VERSION_MINOR \([0-9][0-9]*\).*/\1/p' include/te.h)
if [ -z "$major" ] || [ -z "$minor" ]; then
  echo "mk/version.sh: include/te.h does not define TE_ABI_VERSION_MAJOR/MINOR" >&2
  exit 1
fi
base="$major.$minor.0"
if ! command -v git >/dev/null || ! git rev-parse --git-dir >/dev/null 2>&1; then
  echo "$base+dev"
  exit 0
fi
dirty=""
git diff-index --quiet HEAD -- 2>/dev/null || dirty=1
if [ -z "$dirty" ] && git describe --tags --exact-match --match "v$base" >/dev/null 2>&1; then
  echo "$base"
elif [ -n "$dirty" ]; then
  echo "$base+g$(git rev-parse --short=12 HEAD).dirty"
else
  echo "$base+g$(git rev-parse --short=12 HEAD)"
fi
