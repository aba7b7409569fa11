package natscallout_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvroute/kvroute/pkg/testkit/apiserver"
	"github.com/kvroute/kvroute/pkg/transport/natscallout"
)

// What a token costs the callout: read and checked locally (all a refused
// token spends), its signature verified against the API server's keys
// (what a forgery of real claims spends), against a TokenReview by the
// API server (what a token that passes spends once, until it expires).
func BenchmarkATokenCheckedLocallyAgainstATokenReview(b *testing.B) {
	cs, err := kubernetes.NewForConfig(apiServer.Require(b))
	if err != nil {
		b.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(context.Background(), sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	token := apiserver.Token(b, cs, "default", sa.Name, natscallout.DefaultAudience, nil)
	claims, err := natscallout.ParseToken(token)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("local", func(b *testing.B) {
		now := time.Now()
		for b.Loop() {
			c, err := natscallout.ParseToken(token)
			if err != nil || c.Check(now, claims.Issuer, natscallout.DefaultAudience) != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("signature", func(b *testing.B) {
		keys := natscallout.NewKeySet(cs.Discovery().RESTClient(), natscallout.KeySetOptions{})
		if err := keys.Start(b.Context()); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if err := keys.Verify(context.Background(), token); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("review", func(b *testing.B) {
		r := &natscallout.TokenReviewer{Client: cs.AuthenticationV1(), Audience: natscallout.DefaultAudience}
		for b.Loop() {
			if _, err := r.Review(context.Background(), token); err != nil {
				b.Fatal(err)
			}
		}
	})
}
