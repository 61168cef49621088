#!/usr/bin/env bash
# mk/heartbeat.sh LABEL CMD...: runs CMD and, while it runs, prints
# "LABEL: still running (N s)" every HEARTBEAT seconds (default 30), so a
# long compile or test run is never silent for minutes. Exits with CMD's
# status.
set -u
label=$1
shift
every=${HEARTBEAT:-30}
start=$SECONDS
"$@" &
pid=$!
(
  while sleep "$every"; do
    echo "$label: still running ($((SECONDS - start))s)"
  done
) &
hb=$!
wait "$pid"
rc=$?
kill "$hb" 2>/dev/null
wait "$hb" 2>/dev/null
exit "$rc"
