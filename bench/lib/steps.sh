# Shared by the device checks (bench/gpu/check.sh, bench/efa/check.sh):
# step runs one check under the time left of BUDGET seconds and prints one
# verdict line; the caller sets BUDGET, T0, RESULTS and STEP_GREP (what of a
# step's log to echo), and zeroes passed, failed, skipped and names_failed.
# Sourced, not run.

# leaf_results says "skip" when a Go test log has skipped tests and no
# passed one, counting only leaves: a test whose subtests all skipped is
# reported PASS by go test, and must not count as a pass here.
leaf_results() {
	awk '
		match($0, /--- (PASS|FAIL|SKIP): [^ ]+/) {
			split(substr($0, RSTART + 4, RLENGTH - 4), f, ": ")
			verdict[f[2]] = f[1]
		}
		END {
			for (n in verdict) {
				leaf = 1
				for (m in verdict) if (index(m, n "/") == 1) { leaf = 0; break }
				if (!leaf) continue
				if (verdict[n] == "PASS") pass++
				if (verdict[n] == "SKIP") skip++
			}
			print (pass == 0 && skip > 0) ? "skip" : "other"
		}' "$1"
}

step() { # name, timeout seconds, command...
	local name=$1 to=$2
	shift 2
	local left=$((BUDGET - (SECONDS - T0)))
	if [ "$left" -lt 10 ]; then
		echo "== $name: SKIP (out of time)" | tee -a "$RESULTS"
		skipped=$((skipped + 1))
		return
	fi
	[ "$to" -gt "$left" ] && to=$left
	local log
	log=$(mktemp)
	local t=$SECONDS
	timeout "$to" "$@" >"$log" 2>&1
	local rc=$?
	local verdict=PASS
	if [ $rc -eq 77 ]; then
		verdict=SKIP
	elif [ $rc -ne 0 ]; then
		verdict=FAIL
	elif [ "$(leaf_results "$log")" = skip ]; then
		verdict=SKIP
	elif grep -q -- 'OK (skipped=' "$log" && ! grep -q -- '\.\.\. ok$' "$log"; then
		verdict=SKIP
	fi
	case $verdict in
	PASS) passed=$((passed + 1)) ;;
	SKIP) skipped=$((skipped + 1)) ;;
	FAIL)
		failed=$((failed + 1))
		names_failed="$names_failed [$name]"
		;;
	esac
	echo "== $name: $verdict (rc $rc, $((SECONDS - t))s)" | tee -a "$RESULTS"
	grep -E "$STEP_GREP" "$log" | head -20 | tee -a "$RESULTS"
	{
		echo "===== $name"
		cat "$log"
	} >>"$RESULTS.full"
	rm -f "$log"
}

