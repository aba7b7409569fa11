package natscallout

import (
	"flag"
	"os"
	"time"
)

// Flags are the command line of `kv-nats-auth serve`: the Options that
// flags can give, and where the keys, the server and the metrics are. The
// chart's tests parse the arguments it renders with them, so that the
// callout they run is the one the chart configures.
type Flags struct {
	Options
	// Dir holds the keys `kv-nats-auth init` wrote.
	Dir string
	// NATSURL is the server whose requests are answered.
	NATSURL string
	// PodSelector is the label selector of the pool's pods (the
	// InferencePool's selector): a relay is admitted only for a pod it
	// picks.
	PodSelector string
	// HTTPAddr serves /metrics, /healthz and /readyz.
	HTTPAddr string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// KeysRefresh is how often the API server's service-account keys are
	// read again.
	KeysRefresh time.Duration
}

// Register adds the flags to fs, with the environment a pod's downward
// API gives as defaults where there is one.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Dir, "dir", "/etc/nats/auth", "directory `init` wrote the keys into")
	fs.StringVar(&f.NATSURL, "nats-url", "nats://127.0.0.1:4222", "the NATS server whose requests are answered")
	fs.StringVar(&f.Audience, "audience", DefaultAudience, "audience the clients' projected tokens are issued for")
	fs.StringVar(&f.TokenIssuer, "token-issuer", "", "issuer the tokens must name (the API server's --service-account-issuer); empty: the issuer of the callout's own in-cluster token, if it has one")
	fs.StringVar(&f.PodSelector, "pod-selector", "", "label selector of the pool's pods (the InferencePool's, as k=v,...): a relay is admitted only for a pod it picks")
	fs.IntVar(&f.CacheSize, "review-cache-size", 4096, "reviewed tokens remembered until they expire (by hash), so that reconnects need no review")
	fs.StringVar(&f.HTTPAddr, "http-addr", ":9200", "address of /metrics, /healthz and /readyz")
	fs.StringVar(&f.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the pool and of every client's ServiceAccount (POD_NAMESPACE)")
	fs.StringVar(&f.Pool, "pool", os.Getenv("KV_POOL"), "the InferencePool whose subjects are handed out (KV_POOL)")
	fs.StringVar(&f.RelayServiceAccount, "relay-service-account", "", "ServiceAccount of the model-server pods: its pod-bound tokens get their pod's relay rights")
	fs.StringVar(&f.EPPServiceAccount, "epp-service-account", "", "ServiceAccount of the EPP: its tokens may subscribe to the pool's events and request snapshots")
	fs.BoolVar(&f.JetStream, "jetstream", false, "give the EPP the JetStream API of the pool's stream")
	fs.StringVar(&f.Account, "account", DefaultAccount, "account the admitted clients are placed in")
	fs.Float64Var(&f.ReviewsPerSecond, "reviews-per-second", 50, "TokenReviews sent to the API server per second, at most")
	fs.BoolVar(&f.LocalServer, "local-server", false, "answer only the requests of the server connected to, as each member of a NATS cluster's callout must")
	fs.DurationVar(&f.KeysRefresh, "keys-refresh", 5*time.Minute, "how often the API server's service-account keys ("+JWKSPath+") are read again; a token of a key not yet seen also rereads them, at most every 10s")
	fs.DurationVar(&f.UserTTL, "user-ttl", 0, "end every admitted connection after this long, if its token has not expired before; 0: when its token expires")
}
