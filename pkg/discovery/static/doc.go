// Package static keeps the datastore in step with a static endpoints file, for
// deployments without Kubernetes discovery: read at start-up (a bad file stops
// it), then re-read when its content changes.
package static
