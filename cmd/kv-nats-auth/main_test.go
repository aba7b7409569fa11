package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvroute/kvroute/pkg/transport/natscallout"
)

// init writes keys the callout loads and a file the NATS server includes.
func TestInitWritesKeysTheServerAndTheCalloutShare(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := run([]string{"init", "--dir", dir}, io.Discard); err != nil {
		t.Fatal(err)
	}
	issuer, password, err := natscallout.LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := issuer.PublicKey()
	conf := filepath.Join(dir, "nats.conf")
	text := "include \"" + natscallout.ConfFile + "\"\nauthorization { auth_callout { issuer: $KVROUTE_CALLOUT_ISSUER, account: AUTH, auth_users: [kvroute-auth] } }\n" +
		"accounts { AUTH: { users: [ {user: kvroute-auth, password: $KVROUTE_CALLOUT_PASSWORD} ] } }\n"
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the server rejects the included keys: %v", err)
	}
	if opts.AuthCallout == nil || opts.AuthCallout.Issuer != pub {
		t.Fatalf("auth_callout issuer = %+v, want %s", opts.AuthCallout, pub)
	}
	if len(password) < 24 || strings.Contains(text, password) {
		t.Fatalf("password %q", password)
	}
	// A second init (a new pod) makes new keys.
	if err := run([]string{"init", "--dir", dir}, io.Discard); err != nil {
		t.Fatal(err)
	}
	again, _, err := natscallout.LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if p2, _ := again.PublicKey(); p2 == pub {
		t.Error("init made the same issuer twice")
	}
}

func TestUnknownCommandsAreRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"frobnicate"}, {"serve", "--dir", t.TempDir()}} {
		if err := run(args, io.Discard); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}
