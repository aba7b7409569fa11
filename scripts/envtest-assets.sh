#!/usr/bin/env bash
# Builds the etcd and kube-apiserver binaries that envtest needs from the Go
# module proxy and caches them, keyed by version, so that only the first run
# pays for the build. Prints the folder to use as KUBEBUILDER_ASSETS.
#
#   export KUBEBUILDER_ASSETS="$(scripts/envtest-assets.sh)"
#
# The release downloader envtest normally uses is unreachable from CI; both
# binaries build from modules the proxy serves instead.
set -euo pipefail

ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
K8S_VERSION="${K8S_VERSION:-v1.34.2}"
# Staging modules are published as v0.<minor>.<patch> of the same release.
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute-envtest"
assets="$cache_root/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
GO="${GO:-go}"

log() { echo "envtest-assets: $*" >&2; }

# A binary counts as built only when it runs; a half-written file from an
# interrupted build must not be trusted.
usable() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

build_etcd() {
	local work="$1"
	mkdir -p "$work"
	cat >"$work/go.mod" <<MOD
module kvroute.local/envtest-etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
	cat >"$work/tools.go" <<'SRC'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
SRC
	(cd "$work" && "$GO" mod tidy >&2 && "$GO" build -trimpath -o "$assets/etcd.tmp" go.etcd.io/etcd/server/v3 >&2)
	mv "$assets/etcd.tmp" "$assets/etcd"
}

build_apiserver() {
	local work="$1"
	mkdir -p "$work"
	# k8s.io/kubernetes points its staging modules at ./staging with replace
	# directives that do not apply to a dependent module; replace each with
	# its published release instead.
	local gomod
	gomod="$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
	[ -n "$gomod" ] || { log "cannot locate go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
	local staging
	staging="$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$gomod")"
	[ -n "$staging" ] || { log "no staging replaces found in $gomod"; exit 1; }
	{
		echo "module kvroute.local/envtest-apiserver"
		echo
		echo "go 1.24"
		echo
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo
		echo "replace ("
		for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
		echo ")"
	} >"$work/go.mod"
	cat >"$work/tools.go" <<'SRC'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
SRC
	local minor="${K8S_VERSION#v1.}"
	minor="${minor%%.*}"
	(cd "$work" && "$GO" mod tidy >&2 && "$GO" build -trimpath \
		-ldflags "-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
		-o "$assets/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2)
	mv "$assets/kube-apiserver.tmp" "$assets/kube-apiserver"
}

mkdir -p "$assets"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if usable "$assets/etcd"; then
	log "etcd $ETCD_VERSION cached"
else
	log "building etcd $ETCD_VERSION (about 90 s on 2 cores)"
	build_etcd "$work/etcd"
fi
if usable "$assets/kube-apiserver"; then
	log "kube-apiserver $K8S_VERSION cached"
else
	log "building kube-apiserver $K8S_VERSION (several minutes on 2 cores)"
	build_apiserver "$work/apiserver"
fi
echo "$assets"
