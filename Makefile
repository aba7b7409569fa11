# kvroute: the targets a newcomer and CI use. Every target works on a fresh
# machine with Go installed; `make test` prepares what its tests need.

GO       ?= go
PKGS     ?= ./...
BENCH    ?= .
BENCHTIME ?= 1s
FUZZTIME ?= 10000x
REGISTRY ?= ghcr.io/kvroute
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' deploy/charts/kvroute/Chart.yaml)

.PHONY: run test test-interop bench bench-extproc bench-routing bench-routing-virtual bench-ring chaos scale fuzz-smoke lint images help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

run: ## kvroute against random routing on a small simulated fleet (ARGS=--serve keeps it up)
	$(GO) run ./cmd/kvsim demo $(ARGS)

# Does its own set-up (Debian packages when root, else the command to run;
# the tokenizer reference files; envtest's binaries, cached), builds every
# test binary on all cores, then runs the packages one at a time: the suites
# start real NATS and API servers and simulated fleets, and on a 2-core
# machine two side by side starve each other's timing. No test may skip.
test: lint ## set up, vet, gofmt check, and every test with the race detector, one package at a time
	GO=$(GO) ./scripts/test.sh $(PKGS)

test-interop: ## the relay against vLLM's own transport library (needs libzmq3-dev and cgo)
	$(GO) test -race -count=1 -tags libzmq ./pkg/ingest/relay/...

bench: ## run every benchmark (see docs/benchmarks.md for recorded numbers)
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) $(PKGS)

# Every server runs in a process of its own (the EPPs, the floor, the
# engines), so that each pays its own collector for its own heap; this
# process is the Envoy-like client alone. 8-15 minutes on two cores, of
# which the tokenizer's collector cost is about one.
bench-extproc: ## the EPP's ext_proc path against the do-nothing floor, in turns in one run, the tokenizer's collector cost, and the ratios' calibration (8-15 min)
	$(GO) test -run '^$$' -bench 'BenchmarkExtProc(Floor|Rates)' -benchtime 1800x -timeout 40m ./pkg/requestpath/extproc/
	@# The checked row again, four times as many requests: 36 turns of 200 for each side.
	$(GO) test -run '^$$' -bench 'BenchmarkExtProcFloor/tokens=8192/rate1000' -benchtime 7200x -timeout 20m ./pkg/requestpath/extproc/
	@# Collector CPU per request with Qwen3's tokenizer loaded against without it (gc-ratio; at most 1.2x), beside the floor.
	$(GO) test -run '^$$' -bench 'BenchmarkExtProcTokenizerGC' -benchtime 7200x -timeout 20m ./pkg/requestpath/extproc/
	@# What the ratios can tell apart here: the floor against itself and against the floor doing 25-100 µs of work a request,
	@# at 28800 requests a side (at 7200 two identical floors measure p99 ratios 0.55-1.07x apart).
	$(GO) test -run '^$$' -bench 'BenchmarkExtProcWork' -benchtime 28800x -timeout 30m ./pkg/requestpath/extproc/

bench-routing: ## the routing benchmark: writes docs/results/routing/ (~80 min)
	$(GO) run ./cmd/kvsim bench

bench-routing-virtual: ## the same in virtual time, 25 seeds a point: writes docs/results/routing-virtual/ (~6 min)
	$(GO) run ./cmd/kvsim bench --virtual --seeds 25

bench-ring: ## the ring, beside the upstream EPP's binary: writes docs/results/routing-ring/ and docs/routing-benchmark.md's ring results (~1 h)
	scripts/ring-bench.sh

chaos: ## the fault matrix (relays, NATS, two EPP replicas on loopback): writes docs/results/chaos.md (~1 min)
	$(GO) run ./cmd/kvsim chaos --timeout 10m

scale: ## 1k and 10k simulated engines in virtual time through the real event path: writes docs/results/scale.md (a few minutes)
	$(GO) run ./cmd/kvsim scale

fuzz-smoke: ## run each fuzz target briefly (FUZZTIME executions each)
	./scripts/fuzz-smoke.sh $(FUZZTIME)

images: ## build the chart's images with Docker: $(REGISTRY)/{epp,kv-relay,kv-nats-auth}:$(IMAGE_TAG)
	for t in epp kv-relay kv-nats-auth; do docker build -f deploy/images/Dockerfile --target $$t -t $(REGISTRY)/$$t:$(IMAGE_TAG) . || exit 1; done

lint: ## go vet, gofmt, the import rules of docs/architecture.md, and no binary or bulk in git
	$(GO) vet $(PKGS)
	$(GO) run ./scripts/importcheck
	$(GO) run ./scripts/treecheck
	@out="$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
