//go:build tools

package tools
import (
 _ "github.com/nats-io/nats.go"
 _ "github.com/nats-io/nats.go/jetstream"
 _ "github.com/nats-io/nats-server/v2/server"
 _ "github.com/vmihailenco/msgpack/v5"
 _ "github.com/cespare/xxhash/v2"
 _ "github.com/prometheus/client_golang/prometheus"
 _ "github.com/prometheus/client_golang/prometheus/promhttp"
 _ "github.com/prometheus/common/expfmt"
 _ "sigs.k8s.io/yaml"
)
