// Package fleet is a whole request path on loopback for tests and benchmarks:
// an EPP built by epp.New exactly as cmd/epp builds it (embedded NATS, event
// consumer, exact index, scraping, the default scheduling configuration), fed
// by simulated vLLM engines that publish real KV events, each behind an HTTP
// server that answers /metrics, /tokenize and /v1/* as vLLM does. The
// engines can run in a process of their own (Options.Process), and so can
// the EPP, or several fed by the same engines (Options.EPPProcesses), so
// that a benchmark of the EPP measures each EPP's memory, CPU and
// collector alone.
package fleet
