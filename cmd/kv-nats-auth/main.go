// Command kv-nats-auth is the NATS auth callout of the chart's NATS
// server: `init` writes a fresh issuer key and callout password where the
// server includes them, and `serve` answers the server's authorization
// requests, giving each relay the rights of its own pod and the EPP the
// rights to subscribe and request (pkg/transport/natscallout). It runs in
// the NATS pod, an init container and a sidecar.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/kvroute/kvroute/pkg/transport/natscallout"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kv-nats-auth:", err)
		os.Exit(1)
	}
}

const usage = `usage: kv-nats-auth init  --dir DIR
       kv-nats-auth serve --dir DIR [flags]`

func run(args []string, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "init":
		fs := flag.NewFlagSet("init", flag.ContinueOnError)
		fs.SetOutput(stderr)
		dir := fs.String("dir", "/etc/nats/auth", "directory the NATS server includes callout.conf from")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return natscallout.GenerateKeys(*dir)
	case "serve":
		return serve(args[1:], stderr)
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

func serve(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f natscallout.Flags
	f.Register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	o := f.Options
	dir, url, httpAddr, logLevel := &f.Dir, &f.NATSURL, &f.HTTPAddr, &f.LogLevel
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	o.Logger = log
	issuer, password, err := natscallout.LoadKeys(*dir)
	if err != nil {
		return err
	}
	o.Issuer = issuer
	cfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	o.Reviewer = &natscallout.TokenReviewer{Client: cs.AuthenticationV1(), Audience: o.Audience}
	if o.TokenIssuer == "" {
		o.TokenIssuer = ownIssuer()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	keys := natscallout.NewKeySet(cs.Discovery().RESTClient(), natscallout.KeySetOptions{Refresh: f.KeysRefresh})
	if err := keys.Start(ctx); err != nil {
		return err
	}
	o.Signatures = keys
	if o.RelayServiceAccount != "" {
		sel, err := labels.Parse(f.PodSelector)
		if err != nil || sel.Empty() {
			return fmt.Errorf("--pod-selector %q: the pool's pods must be named by a non-empty selector (%v)", f.PodSelector, err)
		}
		pods := natscallout.NewPodLister(cs, o.Namespace, sel)
		if err := pods.Start(ctx); err != nil {
			return err
		}
		defer pods.Shutdown()
		o.Pods = pods
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o.Registerer = reg

	nc, err := nats.Connect(*url, nats.Name("kv-nats-auth"), nats.UserInfo(natscallout.AuthUser, password),
		nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectWait(250*time.Millisecond), nats.Timeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", *url, err)
	}
	defer nc.Close()
	svc, err := natscallout.New(nc, o)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("--http-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !nc.IsConnected() {
			http.Error(w, "NATS not connected", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("auth callout serving", "nats", *url, "namespace", o.Namespace, "pool", o.Pool,
		"relay_service_account", o.RelayServiceAccount, "epp_service_account", o.EPPServiceAccount,
		"pod_selector", f.PodSelector, "token_issuer", o.TokenIssuer, "signing_keys", keys.Kids())
	return svc.Run(ctx)
}

// inClusterToken is where the kubelet mounts the pod's own ServiceAccount
// token.
const inClusterToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// ownIssuer is the issuer of the callout's own token: the API server signs
// every ServiceAccount token of the cluster with the same one.
func ownIssuer() string {
	b, err := os.ReadFile(inClusterToken)
	if err != nil {
		return ""
	}
	c, err := natscallout.ParseToken(strings.TrimSpace(string(b)))
	if err != nil {
		return ""
	}
	return c.Issuer
}
