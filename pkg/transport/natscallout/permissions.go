package natscallout

import (
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/kvroute/kvroute/pkg/events"
)

// Role is what a verified token may do on NATS.
type Role string

const (
	// RoleRelay is a pod's relay: it publishes that pod's events and
	// answers that pod's snapshot requests, nothing else.
	RoleRelay Role = "relay"
	// RoleEPP subscribes to the pool's events and requests snapshots; it
	// publishes no events.
	RoleEPP Role = "epp"
)

// snapshotReplies bounds the replies a relay may send to one snapshot
// request (one per chunk; the EPP accepts at most 65536) and how long it
// may take.
const (
	snapshotReplies = 1 << 16
	snapshotTTL     = time.Minute
)

// RelayPermissions are the rights of the relay of pod: publish on the
// pod's event subject, subscribe to its snapshot subject, and reply to the
// requests that arrive there.
func RelayPermissions(namespace, pool, pod string) jwt.Permissions {
	return jwt.Permissions{
		Pub:  jwt.Permission{Allow: jwt.StringList{events.Subject(namespace, pool, pod)}},
		Sub:  jwt.Permission{Allow: jwt.StringList{events.SnapshotSubject(namespace, pool, pod)}},
		Resp: &jwt.ResponsePermission{MaxMsgs: snapshotReplies, Expires: snapshotTTL},
	}
}

// EPPPermissions are the EPP's rights: subscribe to every event subject of
// the pool and to its own inbox (events.EPPInboxPrefix), publish snapshot
// requests, publish and subscribe to the pool's dispatch subject (where
// its replicas share what they dispatched), and, with jetStream, create the pool's stream (if it is
// missing), read it and run ordered consumers on it. It publishes no
// event, and may not update, purge or delete the stream or its messages:
// those would rewrite every pod's history at once.
func EPPPermissions(namespace, pool string, jetStream bool, stream string) jwt.Permissions {
	p := jwt.Permissions{
		Pub: jwt.Permission{Allow: jwt.StringList{
			events.SnapshotSubjectPrefix + "." + events.SubjectToken(namespace) + "." + events.SubjectToken(pool) + ".*",
			events.DispatchSubject(namespace, pool),
		}},
		Sub: jwt.Permission{Allow: jwt.StringList{events.PoolSubject(namespace, pool), events.EPPInboxPrefix + ".>", events.DispatchSubject(namespace, pool)}},
	}
	if jetStream {
		if stream == "" {
			stream = events.StreamName(namespace, pool)
		}
		p.Pub.Allow.Add(
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO."+stream,
			"$JS.API.STREAM.CREATE."+stream,
			"$JS.API.CONSUMER.CREATE."+stream,
			"$JS.API.CONSUMER.CREATE."+stream+".>",
			"$JS.API.CONSUMER.INFO."+stream+".>",
			"$JS.API.CONSUMER.DELETE."+stream+".>",
			"$JS.API.CONSUMER.MSG.NEXT."+stream+".>",
		)
		// Denied outright, whatever is allowed above or added later.
		p.Pub.Deny.Add(
			"$JS.API.STREAM.UPDATE.*",
			"$JS.API.STREAM.PURGE.*",
			"$JS.API.STREAM.DELETE.*",
			"$JS.API.STREAM.MSG.DELETE.*",
		)
	}
	return p
}
