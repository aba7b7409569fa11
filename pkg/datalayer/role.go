package datalayer

// RoleLabel is the pod label naming the stages of disaggregated serving a
// pod serves, as llm-d names it.
const RoleLabel = "llm-d.ai/role"

// Role is the set of stages a pod's RoleLabel says it serves. Filters of
// every request read it, so the datastore parses it once per endpoint
// rather than each request looking the label up.
type Role uint8

// The stages, and Unlabelled for a pod without the label (a pool that does
// not disaggregate serves every stage on every pod).
const (
	RolePrefill Role = 1 << iota
	RoleDecode
	RoleEncode
	RoleUnlabelled
	// roleKnown marks a candidate's role as parsed.
	roleKnown
)

// RoleOf parses the role label among labels: prefill, decode, encode,
// prefill-decode, encode-prefill, encode-prefill-decode, or both (prefill
// and decode). A value it does not know serves no stage.
func RoleOf(labels map[string]string) Role {
	v, ok := labels[RoleLabel]
	if !ok {
		return RoleUnlabelled
	}
	switch v {
	case "prefill":
		return RolePrefill
	case "decode":
		return RoleDecode
	case "encode":
		return RoleEncode
	case "prefill-decode", "both":
		return RolePrefill | RoleDecode
	case "encode-prefill":
		return RoleEncode | RolePrefill
	case "encode-prefill-decode":
		return RoleEncode | RolePrefill | RoleDecode
	}
	return 0
}

// Role is the candidate's endpoint's role, parsed once when the datastore
// took the endpoint in.
func (c *Candidate) Role() Role {
	if c.role&roleKnown != 0 {
		return c.role &^ roleKnown
	}
	if c.Endpoint == nil {
		return RoleUnlabelled
	}
	return RoleOf(c.Labels)
}
