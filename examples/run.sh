#!/usr/bin/env bash
# examples/run.sh: builds and runs every example against what `make` built
# (make test-examples calls it), as a user would: the Python examples in a
# fresh venv with the wheel installed, the C and C++ ones with CMake's
# find_package(te) against `make install` into a scratch prefix (and the C
# one once more through pkg-config), the Go one with go run, the curl one
# against te-sidecar. Each prints its name and PASS/FAIL; the script runs
# them all and exits 1 if any failed.
#
# Inputs (the Makefile sets them): BUILD (build), PYTHON (python3), GO (go),
# TE_WHEEL (the wheel), TE_LIBTE (libte.so), TE_SIDECAR (te-sidecar).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
GO=${GO:-go}
TE_LIBTE=${TE_LIBTE:-$BUILD/libte.so}
TE_SIDECAR=${TE_SIDECAR:-$BUILD/te-sidecar}
work=$BUILD/examples
rm -rf "$work" && mkdir -p "$work"
failed=0
results=()

step() { # step NAME CMD...: runs CMD, output indented, and records the outcome
  local name=$1
  shift
  echo "--- example $name"
  if "$@" 2>&1 | sed 's/^/    /'; [ "${PIPESTATUS[0]}" -eq 0 ]; then
    results+=("PASS $name")
  else
    results+=("FAIL $name")
    failed=$((failed + 1))
  fi
}

venv() {
  "$PYTHON" -m venv --system-site-packages "$work/venv" &&
    "$work/venv/bin/python" -m pip install -q --no-index --no-deps ${TE_WHEEL:-$BUILD/wheel/te-*.whl}
}
py() { env -u TE_LIBRARY -u PYTHONPATH timeout 300 "$work/venv/bin/python" "$@"; }

install_te() {
  cmake -S . -B "$work/cmake-install" -DBUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX="$(pwd)/$work/prefix" \
    -DTE_PREBUILT_LIBRARY="$(pwd)/$TE_LIBTE" >/dev/null &&
    cmake --install "$work/cmake-install" >/dev/null
}
c_cmake() {
  cmake -S examples/c -B "$work/c" -DCMAKE_PREFIX_PATH="$(pwd)/$work/prefix" >/dev/null &&
    cmake --build "$work/c" -j2 >/dev/null &&
    timeout 120 "$work/c/transfer_c" && timeout 120 "$work/c/transfer_cpp"
}
c_pkgconfig() {
  # pkg-config gives -L and -lte but no rpath: the program needs one (or
  # LD_LIBRARY_PATH) to find libte.so.1 at run time.
  local pc
  pc=$(dirname "$(find "$work/prefix" -name te.pc | head -1)")
  local flags libdir
  flags=$(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs te) && libdir=$(PKG_CONFIG_PATH=$pc pkg-config --variable=libdir te) &&
    cc -std=c11 -Wall -o "$work/transfer_pc" examples/c/transfer.c $flags &&
    if "$work/transfer_pc" >/dev/null 2>&1; then
      echo "linked without an rpath, yet it found libte.so.1: the loader path already has one"
    else
      echo "without an rpath or LD_LIBRARY_PATH it does not start, as README.md says"
    fi &&
    cc -std=c11 -Wall -o "$work/transfer_pc" examples/c/transfer.c $flags "-Wl,-rpath,$libdir" &&
    timeout 120 "$work/transfer_pc"
}

step "python venv with the wheel" venv
step "python/two_process.py" py examples/python/two_process.py
step "mooncake/connector_style.py" py examples/mooncake/connector_style.py
step "make install into a scratch prefix" install_te
step "c/ (CMake, find_package(te)): transfer_c, transfer_cpp" c_cmake
step "c/transfer.c (pkg-config)" c_pkgconfig
# The Go example, stamped with the version make stamps into every other
# artefact, must say that version and log in te's style (README.md, "Logs").
go_example() {
  local version=${TE_VERSION:-$(mk/version.sh)}
  timeout 300 "$GO" run -ldflags "-X github.com/tecache/te/engine.Version=$version" ./examples/go \
    >"$work/go.out" 2>"$work/go.err"
  local rc=$?
  cat "$work/go.out" "$work/go.err"
  [ "$rc" -eq 0 ] || return "$rc"
  if ! grep -qx "te $version" "$work/go.out"; then
    echo "the Go example does not say te $version"
    return 1
  fi
  if grep -v '^time=[^ ]* level=[A-Z]* msg="te: ' "$work/go.err" | grep -q .; then
    echo "the Go example logs lines not in te's style (time=... level=... msg=\"te: ...\"):"
    grep -v '^time=[^ ]* level=[A-Z]* msg="te: ' "$work/go.err"
    return 1
  fi
}
step "go/ (go run)" go_example
step "sidecar/handoff-curl.sh" timeout 120 examples/sidecar/handoff-curl.sh "$TE_SIDECAR"

echo "--- examples"
for r in "${results[@]}"; do echo "$r"; done
[ "$failed" -eq 0 ]
