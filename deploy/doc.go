// Package deploy holds kvroute's Kubernetes deployment: the Helm chart in
// charts/kvroute and the InferencePool CRD in crds. Its tests render the
// chart with Helm's own engine and have a real API server accept every
// object it renders.
package deploy
