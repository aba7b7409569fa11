// Package k8s discovers a pool's serving endpoints from the Kubernetes API
// and keeps a datalayer.Datastore in step with them.
//
// Two modes, as the upstream EPP has: an InferencePool
// (inference.networking.k8s.io/v1) names the pods by its selector and the
// ports by its targetPorts, and changes to it are followed; or, without the
// CRD, a label selector and ports given as options define the pool.
// Either way every ready pod that matches becomes one endpoint per target
// port, and a pod that stops being ready, stops matching or is deleted is
// removed, which makes the index drop what it held.
//
// Watches are limited to the pool's namespace, so the EPP needs only
// namespaced RBAC. Leader election is optional and decides nothing about
// serving: every replica watches and answers picks; the elected replica only
// runs the work given as Options.OnLeader.
package k8s
