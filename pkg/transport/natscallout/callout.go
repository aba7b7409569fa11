// Package natscallout is the NATS auth callout that gives each kvroute
// client the rights of its pod and no more. The NATS server hands every
// connection's credentials to it; it reads the client's projected
// ServiceAccount token locally first (shape, expiry, issuer, audience,
// signature against the API server's published keys, namespace,
// ServiceAccount, and for a relay that its pod exists and is one of the
// pool's), has what passes checked by the Kubernetes API server (a
// TokenReview, remembered until the token expires), and answers with a
// user that expires with the token and whose permissions name that pod's
// subjects only: a relay may publish its own pod's events and answer its
// own pod's snapshot requests; the EPP may subscribe and request, and
// publish no events. No credential is made by hand for any pod.
package natscallout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Subject is where the NATS server sends authorization requests.
const Subject = "$SYS.REQ.USER.AUTH"

// DefaultAccount is the account the issued users are placed in: the one
// the chart's configuration gives the pool's subjects.
const DefaultAccount = "KV"

// Options configure a Service. Zero values mean the documented defaults.
type Options struct {
	// Namespace and Pool name the pool whose subjects are handed out, and
	// the namespace every token's ServiceAccount must be in. Required.
	Namespace, Pool string
	// RelayServiceAccount is the ServiceAccount of the model-server pods:
	// a token of it, bound to a pod, gets that pod's relay rights.
	// EPPServiceAccount is the EPP's: its tokens get the EPP's rights.
	// At least one is required.
	RelayServiceAccount, EPPServiceAccount string
	// JetStream gives the EPP the JetStream API of the pool's stream
	// (Stream, default events.StreamName).
	JetStream bool
	Stream    string
	// Account is the account users are placed in (default DefaultAccount).
	Account string
	// Signatures checks that a token was signed by the API server (a
	// KeySet), before the review budget is touched. Required.
	Signatures SignatureVerifier
	// Reviewer has the API server vouch for a token whose signature is
	// good: it alone knows a token revoked (its pod deleted). Required.
	Reviewer Reviewer
	// Audience is the audience every token must be issued for (default
	// DefaultAudience); TokenIssuer the issuer it must name (the API
	// server's service-account issuer; empty leaves it unchecked). Both
	// are checked before a token is reviewed.
	Audience, TokenIssuer string
	// Pods checks that a token's pod exists with the token's UID and, for
	// a relay, that the pool's selector picks it. Required with
	// RelayServiceAccount.
	Pods Pods
	// CacheSize bounds the reviews remembered until their tokens expire
	// (default 4096; negative remembers none).
	CacheSize int
	// Issuer signs the users and the answers: the account key the
	// server's auth_callout block names as issuer. Required.
	Issuer nkeys.KeyPair
	// ReviewTimeout bounds one review, and one reread of the key set for
	// a token of an unknown key (default 1.5s, within the server's
	// default authorization timeout of 2s).
	ReviewTimeout time.Duration
	// ReviewsPerSecond and ReviewBurst bound the reviews sent to the API
	// server (defaults 50 and 100): a flood of connects is refused here
	// rather than passed on.
	ReviewsPerSecond float64
	ReviewBurst      int
	// Workers is how many requests are served at once (default 8).
	Workers int
	// Each issued user expires when its token does, and the server then
	// closes its connection. UserTTL, when set, ends it sooner: after that
	// long, so that it connects (and is checked) again.
	UserTTL time.Duration
	// QueueGroup shares the requests among replicas of the service
	// (default "kvroute-natsauth").
	QueueGroup string
	// LocalServer answers only the requests of the server the callout is
	// connected to, and joins a queue group of that server's own
	// (QueueGroup.<server name>). The members of a NATS cluster each run a
	// callout with keys of their own: a queue group shared across the
	// cluster would hand one member's request to another's callout, whose
	// signature the first does not accept. So every member's callout hears
	// every request, and leaves those of the others unanswered.
	LocalServer bool
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
}

// ErrOptions: options that cannot describe a callout.
var ErrOptions = errors.New("invalid auth callout options")

// maxTokenBytes bounds a token worth sending to the API server; a
// ServiceAccount token is a few KiB.
const maxTokenBytes = 16 << 10

// Why a connection was refused; the reason label of
// kvroute_natsauth_denied_total.
const (
	denyNoToken              = "no_token"
	denyTooLarge             = "token_too_large"
	denyMalformed            = "malformed_token"
	denyInvalidClaims        = "invalid_claims"
	denyBadSignature         = "bad_signature"
	denyNoKeys               = "keys_unavailable"
	denyPodGone              = "pod_gone"
	denyNotInPool            = "pod_not_in_pool"
	denyReviewMismatch       = "review_mismatch"
	denyRateLimited          = "rate_limited"
	denyReviewFailed         = "review_failed"
	denyUnauthenticated      = "unauthenticated"
	denyNotSA                = "not_service_account"
	denyWrongNamespace       = "wrong_namespace"
	denyUnknownAccount       = "unknown_service_account"
	denyNotPodBound          = "not_pod_bound"
	denyBadRequest           = "bad_request"
	denyIssueFailed          = "issue_failed"
	roleNone            Role = "none"
)

var denyReasons = []string{denyNoToken, denyTooLarge, denyMalformed, denyInvalidClaims, denyBadSignature, denyNoKeys, denyRateLimited,
	denyReviewFailed, denyUnauthenticated, denyNotSA, denyWrongNamespace, denyUnknownAccount, denyNotPodBound,
	denyPodGone, denyNotInPool, denyReviewMismatch, denyBadRequest, denyIssueFailed}

// Service answers the NATS server's authorization requests.
type Service struct {
	nc      *nats.Conn
	o       Options
	issuer  string
	limiter *rate.Limiter
	cache   *reviewCache
	log     *slog.Logger
	logs    *rate.Limiter
	now     func() time.Time

	allowed   *prometheus.CounterVec
	denied    *prometheus.CounterVec
	foreign   prometheus.Counter
	cacheHits prometheus.Counter
	duration  prometheus.Histogram
}

// New returns a Service answering on nc, which must be a connection of
// the server's auth_users (it bypasses the callout it serves).
func New(nc *nats.Conn, o Options) (*Service, error) {
	switch {
	case nc == nil:
		return nil, fmt.Errorf("%w: no NATS connection", ErrOptions)
	case o.Namespace == "" || o.Pool == "":
		return nil, fmt.Errorf("%w: namespace and pool are required", ErrOptions)
	case o.RelayServiceAccount == "" && o.EPPServiceAccount == "":
		return nil, fmt.Errorf("%w: name the relays' or the EPP's ServiceAccount", ErrOptions)
	case o.Reviewer == nil:
		return nil, fmt.Errorf("%w: no token reviewer", ErrOptions)
	case o.Signatures == nil:
		return nil, fmt.Errorf("%w: no signature verifier (the API server's key set)", ErrOptions)
	case o.Issuer == nil:
		return nil, fmt.Errorf("%w: no issuer key", ErrOptions)
	case o.RelayServiceAccount != "" && o.Pods == nil:
		return nil, fmt.Errorf("%w: relays need a pod check (the pool's selector)", ErrOptions)
	}
	pub, err := o.Issuer.PublicKey()
	if err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, fmt.Errorf("%w: the issuer must be an account key", ErrOptions)
	}
	if o.Account == "" {
		o.Account = DefaultAccount
	}
	if o.ReviewTimeout <= 0 {
		o.ReviewTimeout = 1500 * time.Millisecond
	}
	if o.ReviewsPerSecond <= 0 {
		o.ReviewsPerSecond = 50
	}
	if o.ReviewBurst <= 0 {
		o.ReviewBurst = 100
	}
	if o.Audience == "" {
		o.Audience = DefaultAudience
	}
	if o.CacheSize == 0 {
		o.CacheSize = 4096
	}
	if o.Workers <= 0 {
		o.Workers = 8
	}
	if o.QueueGroup == "" {
		o.QueueGroup = "kvroute-natsauth"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Service{
		nc: nc, o: o, issuer: pub,
		limiter: rate.NewLimiter(rate.Limit(o.ReviewsPerSecond), o.ReviewBurst),
		cache:   newReviewCache(o.CacheSize),
		log:     o.Logger.With("component", "nats-auth-callout"),
		logs:    rate.NewLimiter(rate.Every(time.Second), 5),
		now:     time.Now,
		allowed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_natsauth_allowed_total",
			Help: "NATS connections the auth callout admitted, by role (relay, epp).",
		}, []string{"role"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_natsauth_denied_total",
			Help: "NATS connections the auth callout refused, by reason.",
		}, []string{"reason"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_natsauth_review_cache_hits_total",
			Help: "Connections admitted from a review remembered until its token expires, without asking the API server.",
		}),
		foreign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_natsauth_foreign_requests_total",
			Help: "Authorization requests of another cluster member, left to that member's callout (LocalServer).",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_natsauth_review_duration_seconds",
			Help:    "Time to answer one authorization request, the TokenReview included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	for _, r := range denyReasons {
		s.denied.WithLabelValues(r)
	}
	for _, r := range []Role{RoleRelay, RoleEPP} {
		s.allowed.WithLabelValues(string(r))
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{s.allowed, s.denied, s.foreign, s.cacheHits, s.duration} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register auth callout metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Run serves authorization requests until ctx is done; every goroutine it
// starts has ended when it returns.
func (s *Service) Run(ctx context.Context) error {
	reqs := make(chan *nats.Msg, 4*s.o.Workers)
	group := s.o.QueueGroup
	if s.o.LocalServer {
		group += "." + s.nc.ConnectedServerName()
	}
	sub, err := s.nc.ChanQueueSubscribe(Subject, group, reqs)
	if err != nil {
		return fmt.Errorf("auth callout: subscribe %s: %w", Subject, err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil && ctx.Err() == nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("auth callout: subscribe %s: %w", Subject, err)
	}
	var wg sync.WaitGroup
	for range s.o.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-reqs:
					s.serve(ctx, m)
				}
			}
		})
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	wg.Wait()
	return nil
}

// serve answers one request.
func (s *Service) serve(ctx context.Context, m *nats.Msg) {
	start := time.Now()
	defer func() { s.duration.Observe(time.Since(start).Seconds()) }()
	req, err := jwt.DecodeAuthorizationRequestClaims(string(m.Data))
	if err != nil || req.UserNkey == "" || req.Server.ID == "" {
		// Without the user key and server there is no answer to sign;
		// the server times the connection out.
		s.denied.WithLabelValues(denyBadRequest).Inc()
		return
	}
	if s.o.LocalServer && req.Server.Name != s.nc.ConnectedServerName() {
		s.foreign.Inc()
		return
	}
	d := s.decide(ctx, req)
	if d.reason != "" {
		s.deny(m, req, d.reason, d.err)
		return
	}
	uc := jwt.NewUserClaims(req.UserNkey)
	uc.Name = d.name
	uc.Audience = s.o.Account
	uc.Permissions = d.perms
	// The server closes the connection when the user expires: a token
	// revoked or rotated away keeps its connection no longer than it
	// would have been accepted.
	expires := d.expires
	if s.o.UserTTL > 0 {
		if ttl := s.now().Add(s.o.UserTTL); ttl.Before(expires) {
			expires = ttl
		}
	}
	uc.Expires = expires.Unix()
	ujwt, err := uc.Encode(s.o.Issuer)
	if err != nil {
		s.deny(m, req, denyIssueFailed, err)
		return
	}
	// Counted before the answer, so that a client the server has let in
	// is always in the count.
	s.allowed.WithLabelValues(string(d.role)).Inc()
	s.respond(m, req, ujwt, "")
}

// decision is what decide made of a request: a role with its rights until
// expires, or a refusal's reason.
type decision struct {
	role    Role
	perms   jwt.Permissions
	name    string
	expires time.Time
	reason  string
	err     error
}

func refuse(reason string, err error) decision {
	return decision{role: roleNone, reason: reason, err: err}
}

// decide checks the request's token and says what its bearer may do.
// Everything that can be checked without the API server is checked before
// the review budget is touched, so tokens that cannot pass never spend it.
func (s *Service) decide(ctx context.Context, req *jwt.AuthorizationRequestClaims) decision {
	token := req.ConnectOptions.Token
	switch {
	case token == "":
		return refuse(denyNoToken, errors.New("no token: connect with a projected ServiceAccount token (--nats-token-file)"))
	case len(token) > maxTokenBytes:
		return refuse(denyTooLarge, fmt.Errorf("a token of %d bytes", len(token)))
	}
	claims, err := ParseToken(token)
	if err != nil {
		return refuse(denyMalformed, err)
	}
	now := s.now()
	if err := claims.Check(now, s.o.TokenIssuer, s.o.Audience); err != nil {
		return refuse(denyInvalidClaims, err)
	}
	// A forged token can copy every claim of a real one; only the
	// signature tells them apart without asking the API server.
	vctx, vcancel := context.WithTimeout(ctx, s.o.ReviewTimeout)
	err = s.o.Signatures.Verify(vctx, token)
	vcancel()
	if err != nil {
		if errors.Is(err, ErrNoKeys) {
			return refuse(denyNoKeys, err)
		}
		return refuse(denyBadSignature, err)
	}
	role, d := s.roleOf(claims.Namespace, claims.ServiceAccount, claims.Pod)
	if d.reason != "" {
		return d
	}
	if claims.Pod != "" && s.o.Pods != nil {
		if err := s.o.Pods.Check(ctx, s.o.Namespace, claims.Pod, claims.PodUID, role == RoleRelay); err != nil {
			s.cache.forget(token)
			if errors.Is(err, ErrPodNotInPool) {
				return refuse(denyNotInPool, err)
			}
			if errors.Is(err, ErrPodGone) {
				return refuse(denyPodGone, err)
			}
			return refuse(denyReviewFailed, err)
		}
	}
	id, hit := s.cache.get(token, now)
	if hit {
		s.cacheHits.Inc()
	} else {
		if !s.limiter.Allow() {
			return refuse(denyRateLimited, errors.New("too many connection attempts; retry"))
		}
		rctx, cancel := context.WithTimeout(ctx, s.o.ReviewTimeout)
		defer cancel()
		id, err = s.o.Reviewer.Review(rctx, token)
		switch {
		case errors.Is(err, ErrUnauthenticated):
			return refuse(denyUnauthenticated, err)
		case errors.Is(err, ErrNotServiceAccount):
			return refuse(denyNotSA, err)
		case err != nil:
			return refuse(denyReviewFailed, err)
		}
		// The API server vouches for the identity; the claims checked
		// above must be that identity's, or the checks were of nothing.
		if id.Namespace != claims.Namespace || id.ServiceAccount != claims.ServiceAccount || id.Pod != claims.Pod || id.PodUID != claims.PodUID {
			return refuse(denyReviewMismatch, fmt.Errorf("the review vouches for %+v, the token claims %s/%s pod %q (%s)",
				id, claims.Namespace, claims.ServiceAccount, claims.Pod, claims.PodUID))
		}
		s.cache.put(token, id, claims.Expiry, now)
	}
	switch role {
	case RoleRelay:
		return decision{role: RoleRelay, perms: RelayPermissions(s.o.Namespace, s.o.Pool, id.Pod), name: "relay/" + id.Pod, expires: claims.Expiry}
	default:
		return decision{role: RoleEPP, perms: EPPPermissions(s.o.Namespace, s.o.Pool, s.o.JetStream, s.o.Stream), name: "epp/" + id.Pod, expires: claims.Expiry}
	}
}

// roleOf says what a token of namespace/serviceAccount, bound to pod, may
// be, from its claims; a decision with a reason is a refusal.
func (s *Service) roleOf(namespace, serviceAccount, pod string) (Role, decision) {
	switch {
	case namespace == "" || serviceAccount == "":
		return roleNone, refuse(denyNotSA, errors.New("the token names no ServiceAccount"))
	case namespace != s.o.Namespace:
		return roleNone, refuse(denyWrongNamespace, fmt.Errorf("ServiceAccount %s/%s is outside namespace %s", namespace, serviceAccount, s.o.Namespace))
	}
	switch serviceAccount {
	case s.o.RelayServiceAccount:
		if pod == "" {
			return roleNone, refuse(denyNotPodBound, fmt.Errorf("a relay token of %s/%s bound to no pod", namespace, serviceAccount))
		}
		return RoleRelay, decision{}
	case s.o.EPPServiceAccount:
		return RoleEPP, decision{}
	}
	return roleNone, refuse(denyUnknownAccount, fmt.Errorf("ServiceAccount %s/%s has no NATS rights", namespace, serviceAccount))
}

func (s *Service) deny(m *nats.Msg, req *jwt.AuthorizationRequestClaims, reason string, err error) {
	s.denied.WithLabelValues(reason).Inc()
	if s.logs.Allow() {
		s.log.Warn("NATS connection refused", "reason", reason, "client", req.ClientInformation.Host, "name", truncate(req.ConnectOptions.Name), "err", err)
	}
	s.respond(m, req, "", "not authorized: "+reason)
}

// respond signs and sends the answer: a user JWT, or an error.
func (s *Service) respond(m *nats.Msg, req *jwt.AuthorizationRequestClaims, userJWT, denial string) {
	rc := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	rc.Audience = req.Server.ID
	rc.Jwt = userJWT
	rc.Error = denial
	token, err := rc.Encode(s.o.Issuer)
	if err != nil {
		if s.logs.Allow() {
			s.log.Warn("authorization answer not signed", "err", err)
		}
		return
	}
	_ = m.Respond([]byte(token))
}

func truncate(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
