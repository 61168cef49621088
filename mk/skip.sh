#!/usr/bin/env bash
# mk/skip.sh REASON: a suite's recipe calls it when it runs nothing (a
# prerequisite is absent). It prints "skipped: REASON" and, under
# mk/suites.sh (which sets TE_SUITE_SKIPPED), records REASON so the summary
# says SKIP rather than PASS. It exits 0: a skip is not a failure.
set -u
why="$*"
echo "skipped: $why"
if [ -n "${TE_SUITE_SKIPPED:-}" ]; then
  printf '%s\n' "$why" >>"$TE_SUITE_SKIPPED"
fi
exit 0
