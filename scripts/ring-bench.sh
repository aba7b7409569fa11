#!/usr/bin/env bash
# The ring: the routing benchmark's runs beside the upstream EPP's own
# binary, each into docs/results/routing-ring/<run>/ with its progress lines, what
# ran, when, and the machine's load average sampled every 15 s; then
# `kvsim ring-report` regenerates docs/routing-benchmark.md's results from
# every run folder present. RUNS selects runs by name (default all, in the
# order below: the most telling first).
set -euo pipefail
cd "$(dirname "$0")/.."

KVROUTE_UPSTREAM_EPP="${KVROUTE_UPSTREAM_EPP:-$(scripts/upstream-epp.sh)}"
KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$(scripts/envtest-assets.sh)}"
export KVROUTE_UPSTREAM_EPP KUBEBUILDER_ASSETS

out=docs/results/routing-ring
ring=kvroute-predicted-latency,kvroute-precise,kvroute-upstream-config,upstream-epp,upstream-epp-approx,approx-prefix
pair=kvroute-predicted-latency,upstream-epp
fam=kvroute-predicted-latency,kvroute-precise,upstream-epp

declare -A args=(
	[cp-0.75x]="-workloads cache-pressure -rates 36,54 -seeds 3 -policies $ring"
	[cp-1x]="-workloads cache-pressure-1x -seeds 3 -policies $ring"
	[cp-1.5x]="-workloads cache-pressure-1.5x -seeds 3 -policies $ring"
	[replicas-2]="-workloads cache-pressure -rates 36 -seeds 3 -replicas 2 -policies $pair"
	[replicas-3]="-workloads cache-pressure -rates 36 -seeds 3 -replicas 3 -policies $pair"
	[restart]="-workloads cache-pressure -rates 36 -seeds 3 -restart-at 4s -policies $pair"
	[bypass]="-workloads cache-pressure -rates 36 -seeds 3 -bypass 0.25 -policies $pair"
	[family-no-chunk]="-workloads cache-pressure -rates 36 -seeds 3 -family no-chunk -policies $fam"
	[family-fifo]="-workloads cache-pressure -rates 36 -seeds 3 -family fifo -policies $fam"
	[family-drawn]="-workloads cache-pressure -rates 36 -seeds 3 -family drawn -policies $fam"
	[top-shared-prefix]="-workloads shared-prefix -rates 40 -seeds 3 -policies $ring"
	[top-multi-turn]="-workloads multi-turn -rates 32 -seeds 3 -policies $ring"
	[top-agent]="-workloads agent -rates 42 -seeds 3 -policies $ring"
	[top-mixed-slo]="-workloads mixed-slo -rates 60 -seeds 3 -policies $ring"
	[top-unrelated]="-workloads unrelated -rates 18 -seeds 3 -policies $ring"
	[top-cache-pressure-cpu]="-workloads cache-pressure-cpu -rates 36 -seeds 3 -policies $ring"
)
order=(cp-0.75x cp-1x cp-1.5x replicas-2 replicas-3 restart bypass family-no-chunk family-fifo family-drawn
	top-shared-prefix top-multi-turn top-agent top-mixed-slo top-unrelated top-cache-pressure-cpu)

# What ran is the committed tree: a run names its commit, and local
# changes would make that a lie.
if ! git diff --quiet HEAD -- cmd pkg go.mod go.sum; then
	echo "ring-bench: commit or stash the changes under cmd/ and pkg/ first" >&2
	exit 2
fi
commit=$(git rev-parse --short=12 HEAD)
bin=$(mktemp -d)/kvsim
go build -o "$bin" ./cmd/kvsim
for run in ${RUNS:-${order[*]}}; do
	[[ -n "${args[$run]:-}" ]] || { echo "ring-bench: no run $run" >&2; exit 2; }
	dir="$out/$run"
	rm -rf "$dir" && mkdir -p "$dir"
	# shellcheck disable=SC2086
	cmd="go run ./cmd/kvsim bench ${args[$run]} -out $dir"
	(while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>"$dir/load.txt"; sleep 15; done) &
	sampler=$!
	started=$(date -u +%FT%TZ)
	# shellcheck disable=SC2086
	if ! "$bin" bench ${args[$run]} -out "$dir" >"$dir/progress.txt" 2>"$dir/stderr.txt"; then
		kill "$sampler"
		echo "ring-bench: $run failed; see $dir/stderr.txt" >&2
		exit 1
	fi
	kill "$sampler"
	rm -f "$dir/stderr.txt"
	printf '{"run": "%s", "command": "%s", "commit": "%s", "started": "%s", "finished": "%s"}\n' \
		"$run" "$cmd" "$commit" "$started" "$(date -u +%FT%TZ)" >"$dir/run.json"
	echo "ring-bench: $run done"
done
go run ./cmd/kvsim ring-report
