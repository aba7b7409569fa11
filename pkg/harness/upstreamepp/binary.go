package upstreamepp

import (
	"debug/buildinfo"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
)

// The upstream EPP this package runs: the last release whose module holds
// the EPP. go.mod requires the same module version, so the CRDs installed
// and the API types this package writes are the binary's own.
const (
	Module  = "sigs.k8s.io/gateway-api-inference-extension"
	Version = "v1.5.0"
)

// Errors a caller can test for with errors.Is.
var (
	// ErrNoBinary: the upstream EPP is not built; scripts/upstream-epp.sh
	// builds it.
	ErrNoBinary = errors.New("upstream EPP binary not found")
	// ErrNoAssets: envtest's binaries are not built;
	// scripts/envtest-assets.sh builds them.
	ErrNoAssets = errors.New("envtest assets not found")
)

// BinaryEnv names the variable that points at the binary, as
// `export KVROUTE_UPSTREAM_EPP="$(scripts/upstream-epp.sh)"` sets it.
const BinaryEnv = "KVROUTE_UPSTREAM_EPP"

// Configurations the binary runs with.
const (
	// ConfigDefault is upstream's built-in configuration: no --config-file.
	ConfigDefault = ""
	// ConfigApproxName names ConfigApprox in reports.
	ConfigApproxName = "gie-v1.5.0-chart-default-plugins.yaml"
)

// ConfigApprox is the configuration upstream's Helm chart deploys at
// v1.5.0 (approximate prefix routing: prefix-cache-scorer 3, queue-scorer
// 2, kv-cache-utilization-scorer 2, metrics scraped over HTTP), the file
// named ConfigApproxName with its source in its header. Its profile is
// the built-in default's, written out as users deploy it.
//
//go:embed gie-v1.5.0-chart-default-plugins.yaml
var ConfigApprox string

// cacheRoot is where scripts/upstream-epp.sh and
// scripts/envtest-assets.sh keep what they build.
func cacheRoot() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache")
}

// Binary is the upstream EPP binary: $KVROUTE_UPSTREAM_EPP, or where
// scripts/upstream-epp.sh caches it. It must be the pinned version, by its
// own build information.
func Binary() (string, error) {
	path := os.Getenv(BinaryEnv)
	if path == "" {
		path = filepath.Join(cacheRoot(), "kvroute-upstream-epp", Version, "epp")
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%w at %s: run scripts/upstream-epp.sh (it builds %s/cmd/epp@%s once and caches it)", ErrNoBinary, path, Module, Version)
	}
	if err := checkBuild(path); err != nil {
		return "", err
	}
	return path, nil
}

// checkBuild reads the binary's build information: a binary of another
// module or version, or a half-written file, is refused.
func checkBuild(path string) error {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: %s has no Go build information (%v): run scripts/upstream-epp.sh", ErrNoBinary, path, err)
	}
	if v := moduleVersion(bi); v != Version {
		return fmt.Errorf("%w: %s is %s@%q, want %s: run scripts/upstream-epp.sh", ErrNoBinary, path, Module, v, Version)
	}
	return nil
}

func moduleVersion(bi *debug.BuildInfo) string {
	if bi.Main.Path == Module {
		return bi.Main.Version
	}
	return ""
}

// The envtest assets scripts/envtest-assets.sh builds by default.
const defaultAssets = "kvroute-envtest/k8s-v1.34.2-etcd-v3.6.16"

// Assets is the folder of envtest's kube-apiserver and etcd:
// $KUBEBUILDER_ASSETS, or where scripts/envtest-assets.sh caches them.
func Assets() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(cacheRoot(), defaultAssets)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%w: no %s in %s: run `export KUBEBUILDER_ASSETS=\"$(scripts/envtest-assets.sh)\"`", ErrNoAssets, b, dir)
		}
	}
	return dir, nil
}

// CRDDir is the module's CRD folder (config/crd/bases) in the module
// cache, downloaded there by the go command if it is not yet.
func CRDDir() (string, error) {
	out, err := exec.Command("go", "mod", "download", "-json", Module+"@"+Version).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("upstreamepp: go mod download %s@%s: %w", Module, Version, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("upstreamepp: go mod download %s@%s: %w", Module, Version, err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("upstreamepp: go mod download %s@%s: %s", Module, Version, m.Error)
	}
	dir := filepath.Join(m.Dir, "config", "crd", "bases")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("upstreamepp: the module's CRDs: %w", err)
	}
	return dir, nil
}
