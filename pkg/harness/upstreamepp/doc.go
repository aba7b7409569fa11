// Package upstreamepp runs the upstream EPP, the Gateway API Inference
// Extension's own cmd/epp binary at a pinned version, against a simulated
// fleet, as a Kubernetes cluster would run it: envtest's API server with the
// module's CRDs, an InferencePool, one ready Pod per engine whose IP is the
// engine's own loopback address, and the binary as a child process that
// discovers them, scrapes their metrics and answers ext_proc.
//
// The binary is built once from the Go module proxy and cached by
// scripts/upstream-epp.sh; Binary finds it. The API server's binaries are
// envtest's, from scripts/envtest-assets.sh; Assets finds them.
package upstreamepp
