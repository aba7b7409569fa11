package main

import (
	"strings"
	"testing"
)

func TestRunRefusesFlagsThatCannotWork(t *testing.T) {
	t.Parallel()
	base := []string{"--nats-url", "nats://127.0.0.1:1", "--http-addr", "127.0.0.1:0", "--zmq-endpoint", "tcp://127.0.0.1:0",
		"--namespace", "ns", "--pool", "pool", "--pod", "p", "--pod-ip", "10.0.0.1"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown ZeroMQ mode", []string{"--zmq-mode", "both"}, "--zmq-mode"},
		{"a missing pod name", []string{"--pod", ""}, "pod"},
		{"a log level that does not exist", []string{"--log-level", "loud"}, "--log-level"},
		{"two ways to authenticate to NATS", []string{"--nats-token", "t", "--nats-user", "u"}, "NATS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := run(append(append([]string{}, base...), tc.args...))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run returned %v, want an error about %q", err, tc.want)
			}
		})
	}
}
