// Package static keeps the datastore in step with a static endpoints file,
// and the objectives store with a static objectives file, for deployments
// without Kubernetes discovery: each read at start-up (a bad file stops it),
// then re-read when its content changes.
package static
