// Package enginesched models a model server's scheduler (vLLM's): run
// forward over the requests an endpoint holds, it says what work a new
// request waits behind before its prefill starts. The EPP's in-flight
// accounting replays it at the first read after a change (datalayer),
// and the latency predictor learns what each unit of that work costs
// (predict).
package enginesched
