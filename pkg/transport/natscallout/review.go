package natscallout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
)

// DefaultAudience is the audience the relays' and the EPP's projected
// tokens are issued for: a token for the API server (or anything else)
// is not accepted here, and one issued for NATS is no use elsewhere.
const DefaultAudience = "kvroute-nats"

// Errors of a review; each is a denial reason.
var (
	// ErrUnauthenticated: the API server does not vouch for the token
	// (forged, expired, its pod deleted, or issued for another audience).
	ErrUnauthenticated = errors.New("token not authenticated")
	// ErrNotServiceAccount: the token is a user's, not a ServiceAccount's.
	ErrNotServiceAccount = errors.New("token is not a ServiceAccount's")
)

// Identity is what the API server vouches for about a token.
type Identity struct {
	// Namespace and ServiceAccount name the token's ServiceAccount.
	Namespace, ServiceAccount string
	// Pod is the pod the token is bound to, empty when it is not bound to
	// one; PodUID its UID.
	Pod, PodUID string
}

// Reviewer verifies a token and says whose it is.
type Reviewer interface {
	Review(ctx context.Context, token string) (Identity, error)
}

// The extra fields a pod-bound ServiceAccount token's review carries.
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// TokenReviewer asks the API server (a TokenReview) whether a token is
// valid for Audience. For a token bound to a pod the API server also
// checks that the pod still exists with the UID the token names, so a
// deleted pod's token stops working at once.
type TokenReviewer struct {
	Client   authclient.TokenReviewsGetter
	Audience string
}

var _ Reviewer = (*TokenReviewer)(nil)

// Review runs the TokenReview.
func (r *TokenReviewer) Review(ctx context.Context, token string) (Identity, error) {
	aud := r.Audience
	if aud == "" {
		aud = DefaultAudience
	}
	tr, err := r.Client.TokenReviews().Create(ctx, &authv1.TokenReview{
		Spec: authv1.TokenReviewSpec{Token: token, Audiences: []string{aud}},
	}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, fmt.Errorf("token review: %w", err)
	}
	st := tr.Status
	if !st.Authenticated {
		return Identity{}, fmt.Errorf("%w: %s", ErrUnauthenticated, st.Error)
	}
	if !slices.Contains(st.Audiences, aud) {
		return Identity{}, fmt.Errorf("%w: not issued for audience %q", ErrUnauthenticated, aud)
	}
	return identityOf(st.User)
}

// identityOf reads the ServiceAccount and pod out of a reviewed user:
// system:serviceaccount:<namespace>:<name>, with the pod in its extras.
func identityOf(u authv1.UserInfo) (Identity, error) {
	rest, ok := strings.CutPrefix(u.Username, "system:serviceaccount:")
	ns, name, found := strings.Cut(rest, ":")
	if !ok || !found || ns == "" || name == "" {
		return Identity{}, fmt.Errorf("%w: %q", ErrNotServiceAccount, u.Username)
	}
	id := Identity{Namespace: ns, ServiceAccount: name}
	if v := u.Extra[extraPodName]; len(v) == 1 {
		id.Pod = v[0]
	}
	if v := u.Extra[extraPodUID]; len(v) == 1 {
		id.PodUID = v[0]
	}
	return id, nil
}
