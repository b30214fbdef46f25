#!/usr/bin/env bash
# Prints what failed in the logs of make test's passes: each failed test with
# the lines of its message, each panic with its first frames, a timeout's
# report, and the packages that failed. make test calls it when a pass fails,
# so the end of its output names the failure however long the log before it.
# Usage: testfailures.sh LOG...
set -uo pipefail
echo
echo "==== make test failed; what failed, from each pass's log ===="
for log in "$@"; do
	[ -f "$log" ] || continue
	found=$(grep -c -E -e '--- FAIL|panic:|test timed out|^\[[a-z]+\] FAIL[[:space:]]' "$log")
	echo "---- $log: $found line(s) of failure"
	[ "$found" -gt 0 ] || continue
	# A failed test's message follows its "--- FAIL" line, indented; a panic's
	# goroutine dump follows it. Up to 25 lines after each, 400 in all.
	grep -E -A 25 -e '--- FAIL|panic:|test timed out' "$log" | head -n 400
	grep -E -e '^\[[a-z]+\] FAIL[[:space:]]' "$log"
done
# Last, what the failed tests said, a line each (their Errorf, Fatalf and
# Logf lines: a failed test's output only), so that the very end of the
# output names the failure even when a test dumped long logs after it.
echo "---- what the failed tests said, a line each (the last 60)"
for log in "$@"; do
	[ -f "$log" ] || continue
	grep -E -e '^\[[a-z]+\] +[A-Za-z0-9_]+\.go:[0-9]+: ' "$log" | cut -c1-300 | tail -n 60
done
