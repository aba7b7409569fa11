package apiserver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// PodUnder creates, in namespace, a pod that runs under the ServiceAccount
// sa (which must exist) and mounts no token of its own: the pod a token
// is bound to. No kubelet runs it.
func PodUnder(t testing.TB, cs kubernetes.Interface, namespace, name, sa string) *corev1.Pod {
	t.Helper()
	p, err := cs.CoreV1().Pods(namespace).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: sa, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Token asks the API server for a token of sa for audience, bound to pod
// when it is not nil: what the kubelet projects into a pod for a
// serviceAccountToken volume.
func Token(t testing.TB, cs kubernetes.Interface, namespace, sa, audience string, pod *corev1.Pod) string {
	t.Helper()
	req := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: new(int64(3600))}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// TokenFile is Token written to a file, as the projected volume holds it.
func TokenFile(t testing.TB, cs kubernetes.Interface, namespace, sa, audience string, pod *corev1.Pod) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(Token(t, cs, namespace, sa, audience, pod)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
