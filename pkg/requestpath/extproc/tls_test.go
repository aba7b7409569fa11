package extproc

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

func TestCertificatesLoadFromFilesOrAreMade(t *testing.T) {
	t.Parallel()
	made, err := loadOrMakeCert("", "")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(made.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature); err != nil {
		t.Errorf("the made certificate is not self-signed: %v", err)
	}

	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	keyDER, err := x509.MarshalECPrivateKey(made.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: made.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	loaded, err := loadOrMakeCert(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(loaded.Certificate[0]) != string(made.Certificate[0]) {
		t.Error("the loaded certificate is not the one written")
	}
	if _, err := loadOrMakeCert(certFile, filepath.Join(dir, "missing.key")); err == nil {
		t.Error("a missing key file was accepted")
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Error("a server without a director was accepted")
	}
}
