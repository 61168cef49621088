#!/usr/bin/env bash
# mk/suites.sh SUITE...: runs each suite (a make target) in a make of its
# own, whether or not the ones before it passed, so that one failing suite
# hides none of the others. It prints a line as each suite starts, and at
# the end one line per suite (PASS/FAIL, time, exit status) and the total;
# it exits 1 if any suite failed. SUITE_MAKE is the make command to run
# (the Makefile passes "$(MAKE) -f <its makefile>").
set -u
read -r -a make_cmd <<<"${SUITE_MAKE:-make}"
n=$#
i=0
failed=0
lines=()
t_all=$SECONDS
for s in "$@"; do
  i=$((i + 1))
  echo "==> suite $i/$n: $s"
  t0=$SECONDS
  "${make_cmd[@]}" "$s"
  rc=$?
  dt=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then
    st=PASS
  else
    st=FAIL
    failed=$((failed + 1))
  fi
  lines+=("$(printf '%s %-22s %6ss  (exit %d)' "$st" "$s" "$dt" "$rc")")
  echo "==> suite $i/$n: $s: $st (${dt}s)"
done
echo "==> summary"
for l in "${lines[@]}"; do echo "$l"; done
echo "total: $n suites, $((n - failed)) passed, $failed failed, $((SECONDS - t_all))s"
[ "$failed" -eq 0 ]
