#!/usr/bin/env bash
# mk/suites.sh SUITE...: runs each suite (a make target) in a make of its
# own, whether or not the ones before it passed, so that one failing suite
# hides none of the others. It prints a line as each suite starts, and at
# the end one line per suite (PASS/FAIL/SKIP, time, exit status) and the
# total, "total: N suites, N passed, N failed, N skipped, Ns"; it exits 1 if
# any suite failed (skips alone exit 0). SUITE_MAKE is the make command to
# run (the Makefile passes "$(MAKE) -f <its makefile>").
#
# A suite that ran nothing (a prerequisite is absent) says so with
# mk/skip.sh REASON, which writes REASON to the file named by
# TE_SUITE_SKIPPED: this script sets it for each suite, and a suite that
# exits 0 having written it is counted SKIP, not PASS.
set -u
read -r -a make_cmd <<<"${SUITE_MAKE:-make}"
n=$#
i=0
failed=0
skipped=0
lines=()
t_all=$SECONDS
marker=$(mktemp "${TMPDIR:-/tmp}/te-suite-skip.XXXXXX") || exit 1
trap 'rm -f "$marker"' EXIT
for s in "$@"; do
  i=$((i + 1))
  echo "==> suite $i/$n: $s"
  : >"$marker"
  t0=$SECONDS
  TE_SUITE_SKIPPED=$marker "${make_cmd[@]}" "$s"
  rc=$?
  dt=$((SECONDS - t0))
  why=""
  if [ "$rc" -ne 0 ]; then
    st=FAIL
    failed=$((failed + 1))
  elif [ -s "$marker" ]; then
    st=SKIP
    skipped=$((skipped + 1))
    why=": $(head -n 1 "$marker")"
  else
    st=PASS
  fi
  lines+=("$(printf '%s %-22s %6ss  (exit %d)%s' "$st" "$s" "$dt" "$rc" "$why")")
  echo "==> suite $i/$n: $s: $st (${dt}s)"
done
echo "==> summary"
for l in "${lines[@]}"; do echo "$l"; done
echo "total: $n suites, $((n - failed - skipped)) passed, $failed failed, $skipped skipped, $((SECONDS - t_all))s"
[ "$failed" -eq 0 ]
