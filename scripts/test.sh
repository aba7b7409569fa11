#!/usr/bin/env bash
# `make test`: prepares everything the tests need, then runs every test with
# the race detector and no test skipped.
#
#   1. Debian packages: python3-msgpack (the independent encoder of the event
#      decoder's golden vectors) and libzmq3-dev with pkg-config (the relay's
#      interop test, `make test-interop`). Installed with apt-get when run as
#      root; otherwise the one command to run is printed and the run stops.
#   2. The reference tokenizer files: `npm ci` in scripts/tokenizer-golden,
#      again only when its lock file changed since the last install.
#   3. envtest's etcd and kube-apiserver, and the upstream EPP (the Gateway
#      API Inference Extension's cmd/epp, which pkg/harness/upstreamepp's
#      tests run), each built once from the Go module proxy and cached
#      (scripts/envtest-assets.sh, scripts/upstream-epp.sh).
#   4. Every test binary, built at once with all cores; then each package's
#      tests, one package at a time: the suites start real NATS and API
#      servers and simulated fleets, and two side by side on a 2-core machine
#      starve each other's timing. (`go test -p 1` would also build one
#      package at a time.)
#
# KVROUTE_NO_SKIPS=1 is exported, so a test that would skip for something
# missing fails instead.
#
# Usage: scripts/test.sh [packages, default ./...]
set -euo pipefail
cd "$(dirname "$0")/.."
GO="${GO:-go}"
log() { echo "== $*" >&2; }

# 1. Debian packages.
missing=()
# The golden-vector test runs Debian's python3, whatever python3 is first on PATH.
/usr/bin/python3 -c 'import msgpack' >/dev/null 2>&1 || missing+=(python3-msgpack)
{ command -v pkg-config >/dev/null && pkg-config --exists libzmq; } 2>/dev/null || missing+=(libzmq3-dev pkg-config)
command -v npm >/dev/null || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		log "installing ${missing[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	else
		echo "make test needs ${missing[*]}; run:" >&2
		echo "  sudo apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
fi

# 2. Tokenizer reference files; the stamp is npm's own copy of the lock.
golden=scripts/tokenizer-golden
if ! cmp -s "$golden/package-lock.json" "$golden/node_modules/.kvroute-lock"; then
	log "npm ci in $golden"
	npm ci --prefix "$golden" --no-audit --no-fund --loglevel=error >&2
	cp "$golden/package-lock.json" "$golden/node_modules/.kvroute-lock"
fi

# 3. envtest assets and the upstream EPP.
KUBEBUILDER_ASSETS="$(scripts/envtest-assets.sh)"
KVROUTE_UPSTREAM_EPP="$(scripts/upstream-epp.sh)"
export KUBEBUILDER_ASSETS KVROUTE_UPSTREAM_EPP KVROUTE_NO_SKIPS=1

# 4. Build every test binary in parallel, then run them one by one, each in
# its package's directory as go test does.
pkgs=("$@")
[ "${#pkgs[@]}" -gt 0 ] || pkgs=(./...)
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
mapfile -t tested < <("$GO" list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' "${pkgs[@]}")
jobs="$(nproc 2>/dev/null || echo 2)"
log "building ${#tested[@]} test binaries (-race, $jobs at a time)"
printf '%s\n' "${tested[@]}" | cut -d' ' -f1 |
	xargs -P "$jobs" -n 1 sh -c 'exec "$0" test -race -c -o "$1/$(printf %s "$2" | tr / _).test" "$2"' "$GO" "$bin"

failed=() skipped=()
for line in "${tested[@]}"; do
	path="${line%% *}" dir="${line#* }"
	exe="$bin/$(printf %s "$path" | tr / _).test"
	start=$EPOCHREALTIME
	if (cd "$dir" && "$exe" -test.count=1 -test.timeout=10m -test.paniconexit0 -test.v >"$bin/out" 2>&1); then
		if grep -q -- '--- SKIP' "$bin/out"; then
			grep -B2 -A3 -- '--- SKIP' "$bin/out"
			printf 'SKIP\t%s\n' "$path"
			skipped+=("$path")
			continue
		fi
		printf 'ok  \t%s\t%ss\n' "$path" "$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')"
	else
		grep -v -e '^=== \(RUN\|PAUSE\|CONT\|NAME\)' -e '^\s*--- PASS' "$bin/out" | tail -200
		printf 'FAIL\t%s\n' "$path"
		failed+=("$path")
	fi
done
if [ "${#failed[@]}" -gt 0 ] || [ "${#skipped[@]}" -gt 0 ]; then
	echo "make test: ${#failed[@]} packages failed (${failed[*]}), ${#skipped[@]} skipped tests (${skipped[*]})" >&2
	exit 1
fi
echo "make test: ${#tested[@]} packages passed, no test skipped"
