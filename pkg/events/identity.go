package events

import "strings"

// SubjectToken is the subject token a pod name becomes in Subject and
// SnapshotSubject: the name with every byte outside [A-Za-z0-9_-] made '_'.
// Kubernetes pod names are DNS subdomains, so two pods of one namespace
// never share a token.
func SubjectToken(name string) string { return sanitizeToken(name) }

// ParseSubject splits an event subject, kv.events.<namespace>.<pool>.<pod>,
// into its three tokens. ok is false for anything else: another prefix, an
// empty token, or more or fewer than five tokens (which no publisher
// following the contract can make, since Subject sanitises every token).
func ParseSubject(subject string) (namespace, pool, pod string, ok bool) {
	rest, found := strings.CutPrefix(subject, SubjectPrefix+".")
	if !found {
		return "", "", "", false
	}
	namespace, rest, found = strings.Cut(rest, ".")
	if !found || namespace == "" {
		return "", "", "", false
	}
	pool, pod, found = strings.Cut(rest, ".")
	if !found || pool == "" || pod == "" || strings.IndexByte(pod, '.') >= 0 {
		return "", "", "", false
	}
	return namespace, pool, pod, true
}
