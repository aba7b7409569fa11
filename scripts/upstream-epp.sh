#!/usr/bin/env bash
# Builds the upstream EPP (the Gateway API Inference Extension's cmd/epp) from
# the Go module proxy and caches it, keyed by version, so that only the first
# run pays for the build. Prints the binary's path.
#
#   export KVROUTE_UPSTREAM_EPP="$(scripts/upstream-epp.sh)"
#
# v1.5.0 is pinned: it is the last release whose module holds the EPP, and
# the InferencePool CRD the harness installs comes from the same module
# version (go.mod requires it).
set -euo pipefail

UPSTREAM_EPP_VERSION="${UPSTREAM_EPP_VERSION:-v1.5.0}"
MODULE=sigs.k8s.io/gateway-api-inference-extension

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute-upstream-epp"
dir="$cache_root/$UPSTREAM_EPP_VERSION"
GO="${GO:-go}"

log() { echo "upstream-epp: $*" >&2; }

# A binary counts as built only when its build information names the pinned
# module version; a half-written file from an interrupted build has none.
usable() {
	[ -x "$1" ] && "$GO" version -m "$1" 2>/dev/null |
		grep -qE "^[[:space:]]+mod[[:space:]]+$MODULE[[:space:]]+$UPSTREAM_EPP_VERSION([[:space:]]|$)"
}

if usable "$dir/epp"; then
	log "epp $UPSTREAM_EPP_VERSION cached"
else
	log "building epp $UPSTREAM_EPP_VERSION (about 4.5 CPU-minutes with empty module and build caches)"
	mkdir -p "$dir"
	work="$(mktemp -d)"
	trap 'rm -rf "$work"' EXIT
	# go install of module@version builds with that module's own go.mod,
	# untouched by this module's requirements.
	(cd "$work" && GOBIN="$work" GOFLAGS=-trimpath "$GO" install "$MODULE/cmd/epp@$UPSTREAM_EPP_VERSION" >&2)
	mv "$work/epp" "$dir/epp.tmp"
	mv "$dir/epp.tmp" "$dir/epp"
	usable "$dir/epp" || { log "built $dir/epp but its build information does not name $MODULE $UPSTREAM_EPP_VERSION"; exit 1; }
fi
echo "$dir/epp"
