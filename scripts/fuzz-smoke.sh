#!/usr/bin/env bash
# Runs every Go fuzz target in the module briefly, so that a change that makes
# a parser panic on known-odd input is caught in CI.
# Usage: scripts/fuzz-smoke.sh [budget per target, default 10000x]
#
# The budget is a count of executions (Nx) rather than a duration: Go 1.26's
# fuzz coordinator can report "context deadline exceeded" when a -fuzztime
# duration ends while a worker is still minimising an input (go.dev/issue/75804),
# failing a target that found nothing. A count has no deadline to race.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-10000x}"
found=0
while IFS= read -r file; do
	dir="./$(dirname "$file")"
	for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed 's/^func //'); do
		found=$((found + 1))
		echo "== fuzz $dir $target ($fuzztime)"
		go test "$dir" -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime"
	done
done < <(git ls-files -co --exclude-standard '*_test.go' | xargs grep -l '^func Fuzz' | sort)
echo "fuzz-smoke: $found targets ran"
[ "$found" -gt 0 ]
