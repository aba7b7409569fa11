package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	producer "github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
)

// The upstream plugin types, as the Gateway API Inference Extension (GIE,
// v0.5 to v1.5, when its EPP moved), llm-d's inference scheduler (llm-d,
// v0.2 to v0.8) and llm-d's router (its successor, v0.9, v0.10 and main)
// register them, each with its parameters; see docs/plugins.md for the
// table this makes.

// Reasons shared by several entries.
const (
	whyApproxSizing  = "sizing of upstream's approximate prefix index, which the exact index needs none of (it keys each endpoint's blocks at the size its KV events name)"
	whyHistorySize   = "kvroute's routing history keeps up to 31250 blocks per endpoint, upstream's default lruCapacityPerServer, whatever the file sets"
	whyAutoTune      = "kvroute always takes block sizes from the endpoints' events and metrics; its routing history keeps 31250 blocks per endpoint, not the endpoint's GPU blocks as upstream's autoTune does"
	whyEventsConfig  = "kvroute reads KV events from NATS, where each pod's relay publishes them; no ZeroMQ subscription or indexer is configured here"
	whyTokenizer     = "kvroute tokenizes in process (--tokenizer) or with the model server's /tokenize"
	whyScrape        = "kvroute scrapes each endpoint's metrics itself (--scrape-metrics, --refresh-metrics-interval)"
	whyDiscovery     = "kvroute discovers endpoints from the InferencePool or a pod selector (--kubernetes, --endpoint-selector)"
	whyNoPD          = "kvroute does not roll out disaggregated sets; the P/D handlers and deciders split a pool's requests by its pods' roles"
	whyDPPort        = "kvroute sends a request to its data-parallel rank's own port, which a gateway routing to all of the InferencePool's targetPorts reaches (upstream's migration: single-profile-handler with Istio 1.28.1 or later); no sidecar forwards by x-data-parallel-host-port"
	whyPDBlocks      = "the decider reads the decode pod's exact prefix match, in the block size its KV events name"
	whyPDPrefix      = "kvroute's prefix producer publishes the one PrefixCacheMatchInfo the decider reads"
	whyPDHeaders     = "the ext_proc server sets x-prefiller-host-port and x-encoder-hosts-ports from the profile handler's prefill and encode picks"
	whyNoFlowControl = "named by the flowControl section's priority bands (fcfs-ordering-policy, edf-ordering-policy, round-robin-fairness-policy, global-strict-fairness-policy; slo-deadline-ordering-policy as EDF) when the flowControl feature gate is on; eviction and usage-limit policies are kvroute's own: displacement of the lowest priority, release by prediction"
	whySLOAware      = "use predicted-latency-producer, latency-scorer, slo-headroom-tier-filter and latency-slo-admitter in one profile (kvroute's default)"
	whyMulticluster  = "kvroute routes one pool; run one EPP per cluster"
	whySpecTTL       = "kvroute's index holds speculative entries for 2s, upstream's default; another TTL cannot be set"
	whyNoSession     = "kvroute keeps a conversation's turns together through the prefix they share, which the exact index sees"
	whyInFlight      = "kvroute's datastore keeps every endpoint's in-flight requests and prompt tokens still to prefill, from each pick to its response's end; no producer is configured"
)

func honoured(name, seen string, params map[string]paramRule) upstreamType {
	return upstreamType{name: name, seen: seen, class: Honoured, params: params}
}

func superseded(name, seen, target, why string, params map[string]paramRule) upstreamType {
	return upstreamType{name: name, seen: seen, class: Superseded, target: target, why: why, params: params}
}

func refused(name, seen, why string) upstreamType {
	return upstreamType{name: name, seen: seen, class: Refused, why: why}
}

func keep(why string) paramRule { return paramRule{class: Honoured, why: why} }
func drop(why string) paramRule { return paramRule{class: Superseded, why: why} }
func only(why string, ok func(json.RawMessage) bool) paramRule {
	return paramRule{class: Superseded, why: why, refuse: func(raw json.RawMessage) string {
		if ok(raw) {
			return ""
		}
		return why
	}}
}

// Value tests for conditional parameters.
func isNullOrEmpty(raw json.RawMessage) bool {
	t := string(bytes.TrimSpace(raw))
	return t == "" || t == "null" || t == `""` || t == "[]" || t == "{}" || t == "false" || t == "0"
}

// valueIs accepts an absent or empty value, or one that decodes as T and
// passes ok.
func valueIs[T any](ok func(T) bool) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		if isNullOrEmpty(raw) {
			return true
		}
		var v T
		return json.Unmarshal(raw, &v) == nil && ok(v)
	}
}

func isOneOf(vals ...string) func(json.RawMessage) bool {
	return valueIs(func(s string) bool {
		return slices.ContainsFunc(vals, func(v string) bool { return strings.EqualFold(s, v) })
	})
}

func isDuration(want time.Duration) func(json.RawMessage) bool {
	return valueIs(func(s string) bool {
		d, err := time.ParseDuration(s)
		return err == nil && d == want
	})
}

func isNumberAtMost(max float64) func(json.RawMessage) bool {
	return valueIs(func(f float64) bool { return f <= max })
}

// vllmMetricSpecs are upstream's metric spec parameters with the vLLM
// metric each names by default: what kvroute scrapes.
var vllmMetricSpecs = map[string]string{
	"queuedRequestsSpec":  "vllm:num_requests_waiting",
	"runningRequestsSpec": "vllm:num_requests_running",
	"kvUsageSpec":         "vllm:kv_cache_usage_perc",
	"loraSpec":            "vllm:lora_requests_info",
	"cacheInfoSpec":       "vllm:cache_config_info",
}

// vllmEngineConfigs accepts an engineConfigs list that only restates
// vLLM's metric names (an empty spec, which upstream reads as "do not
// extract", changes nothing here: kvroute's plugins treat a missing metric
// as unknown), and refuses any other engine or metric.
func vllmEngineConfigs(raw json.RawMessage) string {
	if isNullOrEmpty(raw) {
		return ""
	}
	var entries []map[string]string
	if err := json.Unmarshal(raw, &entries); err != nil {
		return "engineConfigs is not a list of engine metric specs"
	}
	for _, e := range entries {
		if !strings.EqualFold(e["name"], "vllm") {
			return fmt.Sprintf("engine %q: kvroute reads vLLM's metric names only", e["name"])
		}
		for k, v := range e {
			if k == "name" || v == "" {
				continue
			}
			want, ok := vllmMetricSpecs[k]
			if !ok {
				return fmt.Sprintf("engine vllm: %s cannot be set", k)
			}
			if v != want {
				return fmt.Sprintf("engine vllm: %s = %q: kvroute reads %s", k, v, want)
			}
		}
	}
	return ""
}

var upstreamTypes = func() map[string]upstreamType {
	approxParams := map[string]paramRule{
		"blockSizeTokens":        keep("the approximate fallback's block size, for endpoints without an in-order event stream"),
		"maxPrefixBlocksToMatch": keep("the approximate fallback's match cap, in blocks"),
		"maxPrefixTokensToMatch": keep("the approximate fallback's match cap, in tokens (it wins over blocks, as upstream)"),
		"blockSize":              drop(whyApproxSizing),
		"lruCapacityPerServer":   drop(whyHistorySize),
		"autoTune":               drop(whyAutoTune),
	}
	// The approximate producer's parameters as the scorer took them before
	// the producer split off (GIE up to v1.4, llm-d's estimate mode).
	scorerEra := map[string]paramRule{
		"hashBlockSize":          drop(whyApproxSizing),
		"blockSize":              drop(whyApproxSizing),
		"blockSizeTokens":        drop(whyApproxSizing),
		"maxPrefixBlocksToMatch": drop(whyApproxSizing),
		"lruCapacityPerServer":   drop(whyHistorySize),
		"autoTune":               drop(whyAutoTune),
		"mode": {class: Honoured, why: "llm-d's modes are estimate (placed by the routing history as well as the exact index: routingHistory true, the default) and cache_tracking (by the exact index alone: routingHistory false)",
			refuse: func(raw json.RawMessage) string {
				if isOneOf("estimate", "cache_tracking")(raw) {
					return ""
				}
				return "llm-d's modes are estimate (placed by the routing history as well as the exact index: routingHistory true, the default) and cache_tracking (by the exact index alone: routingHistory false)"
			}},
		"kvEventsConfig":              drop(whyEventsConfig),
		"indexerConfig":               drop(whyEventsConfig),
		"tokenProcessorConfig":        drop(whyEventsConfig + "; " + whyTokenizer),
		"prefixMatchInfoProducerName": drop("kvroute's prefix producer publishes one PrefixCacheMatchInfo, exact where events allow, which every prefix scorer reads"),
		"matchLengthWeight":           keep("blends in how long the match is, as upstream"),
		"matchLengthScaleTokens":      keep("the match length that counts in full"),
	}
	preciseParams := map[string]paramRule{
		"tokenProcessorConfig": drop(whyEventsConfig + "; " + whyTokenizer),
		"indexerConfig":        drop(whyEventsConfig),
		"kvEventsConfig":       drop(whyEventsConfig),
		"speculativeIndexing":  keep("true adds a speculative-prefix-recorder to each profile the plugin serves, so a burst follows its first pick"),
		"speculativeTTL":       only(whySpecTTL, isDuration(2*time.Second)),
	}
	producerParams := map[string]paramRule{
		"tokenProcessorConfig": drop(whyEventsConfig + "; " + whyTokenizer),
		"indexerConfig":        drop(whyEventsConfig),
		"kvEventsConfig":       drop(whyEventsConfig),
		"speculativeIndexing":  keep("true adds a speculative-prefix-recorder to each profile, so a burst follows its first pick"),
		"speculativeTTL":       only(whySpecTTL, isDuration(2*time.Second)),
		"blockSizeTokens":      drop("kvroute keys each endpoint's blocks at the size its KV events name"),
	}
	metricsSource := map[string]paramRule{
		"scheme":             only("kvroute scrapes http://<endpoint>/metrics; another scheme cannot be set", isOneOf("http")),
		"path":               only("kvroute scrapes /metrics; another path cannot be set", isOneOf("/metrics")),
		"insecureSkipVerify": drop("inert over http, the scheme kvroute scrapes"),
		"port":               only("kvroute scrapes the endpoint's own port; another cannot be set", isNullOrEmpty),
		"interval":           drop("--refresh-metrics-interval sets the scrape interval"),
		"caCertPath":         only("kvroute scrapes over http; TLS settings cannot be set", isNullOrEmpty),
		"clientCertPath":     only("kvroute scrapes over http; TLS settings cannot be set", isNullOrEmpty),
		"clientKeyPath":      only("kvroute scrapes over http; TLS settings cannot be set", isNullOrEmpty),
	}
	extractor := map[string]paramRule{
		"defaultEngine":  only("kvroute reads vLLM's metric names; another engine's cannot be selected", isOneOf("vllm")),
		"engineLabelKey": drop("kvroute reads vLLM's metric names from every pod"),
		"engineConfigs":  {class: Superseded, why: "kvroute reads vLLM's metric names; entries for vLLM with its own names are accepted, others refused", refuse: vllmEngineConfigs},
	}
	for k, v := range vllmMetricSpecs {
		extractor[k] = only(fmt.Sprintf("kvroute reads vLLM's %s; another metric cannot be named", v), isOneOf(v))
	}
	for _, k := range []string{"cacheBlockSizeSpec", "cacheNumBlocksSpec", "cacheBlockSizeLabelName", "cacheNumBlocksLabelName"} {
		extractor[k] = only("kvroute reads block sizes from vllm:cache_config_info and each endpoint's KV events; another source cannot be named", isNullOrEmpty)
	}
	tokenizerParams := map[string]paramRule{
		"modelName":          drop(whyTokenizer),
		"udsTokenizerConfig": drop(whyTokenizer),
		"vllm":               drop(whyTokenizer),
		"estimate":           drop("requests with multimodal parts are never matched against the index, so their token counts need no estimate"),
	}
	pickerParams := map[string]paramRule{"maxNumOfEndpoints": keep("the pick and its fallbacks")}

	types := []upstreamType{
		// Scorers.
		honoured("queue-scorer", "GIE v0.5–v1.5; llm-d-router v0.9–main", nil),
		honoured("kv-cache-utilization-scorer", "GIE v1.0–v1.5; llm-d-router v0.9–main", nil),
		superseded("kv-cache-scorer", "GIE v0.5 (renamed kv-cache-utilization-scorer in v1.0)", "kv-cache-utilization-scorer", "the older name of kv-cache-utilization-scorer", nil),
		honoured("running-requests-size-scorer", "GIE v1.3–v1.5; llm-d-router v0.9–main", nil),
		{name: "prefix-cache-scorer", seen: "GIE v0.5–v1.5; llm-d v0.2–v0.8; llm-d-router v0.9–main", class: Honoured, params: scorerEra, translate: translatePrefixScorer},
		{name: "precise-prefix-cache-scorer", seen: "llm-d v0.3–v0.8; llm-d-router v0.9–main", class: Superseded,
			why: "kvroute's precise-prefix-cache-scorer reads its exact, tier-aware index (GPU 1.0, CPU 0.8, storage 0.5)", params: preciseParams, speculates: true},
		honoured("lora-affinity-scorer", "GIE v1.0–v1.5; llm-d-router v0.9–main", nil),
		honoured("load-aware-scorer", "llm-d v0.2–v0.8; llm-d-router v0.9–main", map[string]paramRule{"threshold": keep("the queue length that scores 0")}),
		honoured("no-hit-lru-scorer", "llm-d v0.4–v0.8; llm-d-router v0.9–main", map[string]paramRule{
			"lruSize":                     keep("endpoints remembered"),
			"prefixPluginName":            drop("kvroute's prefix producer publishes the one PrefixCacheMatchInfo it reads"),
			"prefixPluginType":            drop("kvroute's prefix producer publishes the one PrefixCacheMatchInfo it reads"),
			"prefixMatchInfoProducerName": drop("kvroute's prefix producer publishes the one PrefixCacheMatchInfo it reads"),
		}),
		honoured("active-request-scorer", "llm-d v0.3–v0.8; llm-d-router v0.9–main", map[string]paramRule{
			"idleThreshold": keep("endpoints with at most this many requests in flight score 1"),
			"maxBusyScore":  keep("the highest score a busy endpoint gets"),
			"requestTimeout": drop("a request leaves the in-flight count when its response ends or its stream closes, which every request does; " +
				"no timeout is needed to forget lost ones (llm-d-router ignores it too)"),
			"inFlightLoadProducerName": drop(whyInFlight),
		}),
		honoured("token-load-scorer", "GIE v1.5; llm-d-router v0.9–main", map[string]paramRule{
			"queueThresholdTokens":     keep("the prompt tokens in flight that score 0"),
			"inFlightLoadProducerName": drop(whyInFlight),
		}),
		refused("session-affinity-scorer", "llm-d v0.2–v0.8; llm-d-router v0.9–main", whyNoSession),
		refused("context-length-aware", "llm-d v0.7–v0.8; llm-d-router v0.9–main", "kvroute does not route by prompt length; split such pools into InferencePools of their own"),
		refused("header-label-affinity-scorer", "llm-d-router v0.10–main", "kvroute does not score by request headers"),
		refused("endpoint-attribute-scorer", "llm-d-router v0.10–main", "kvroute scores from vLLM's metrics and its index, not arbitrary endpoint attributes"),
		honoured("topology-affinity-scorer", "llm-d-router v0.10–main", map[string]paramRule{
			"topologyProducerName": keep("the topology-extractor whose pod labels are read over the nodes' topology"),
		}),
		refused("mm-embeddings-cache-scorer", "llm-d-router v0.9–main", "kvroute does not track multimodal encoder caches; requests with multimodal parts are never matched against the index, and the other scorers route them"),
		honoured("latency-scorer", "GIE v1.5; llm-d-router v0.9–main", nil),
		refused("predicted-latency-scorer", "GIE v1.3–v1.5", "use latency-scorer, which scores the predicted-latency-producer's predictions"),
		refused("slo-aware-routing", "GIE v1.2", whySLOAware),
		// Filters.
		superseded("lora-affinity-filter", "GIE v0.5", "", "kvroute's lora-affinity-filter keeps LoRA requests on endpoints with the adapter (or room for it) and never empties the candidates", map[string]paramRule{
			"threshold": drop("kvroute always prefers endpoints with the adapter, where upstream did with this probability"),
		}),
		honoured("low-queue-filter", "GIE v0.5", map[string]paramRule{"threshold": keep("the longest queue kept")}),
		honoured("least-queue-filter", "GIE v0.5", nil),
		honoured("least-kv-cache-filter", "GIE v0.5", nil),
		honoured("decision-tree-filter", "GIE v0.5", map[string]paramRule{
			"current": keep("the first filter"), "nextOnSuccess": keep("the filter after one that kept some"),
			"nextOnFailure": keep("the filter after one that kept none"), "nextOnSuccessOrFailure": keep("the filter after either"),
		}),
		honoured("decode-filter", "llm-d v0.2–v0.8; llm-d-router v0.9–main", nil),
		honoured("prefill-filter", "llm-d v0.2–v0.8; llm-d-router v0.9–main", nil),
		honoured("encode-filter", "llm-d v0.7–v0.8; llm-d-router v0.9–main", nil),
		honoured("by-label", "llm-d v0.2–v0.8; llm-d-router v0.9–main (deprecated there)", map[string]paramRule{
			"label": keep("the pod label"), "validValues": keep("the values kept"), "allowsNoLabel": keep("whether pods without the label are kept"),
		}),
		honoured("label-selector-filter", "llm-d-router v0.9–main", map[string]paramRule{
			"matchLabels": keep("a Kubernetes label selector"), "matchExpressions": keep("a Kubernetes label selector"),
		}),
		superseded("by-label-selector", "llm-d v0.2–v0.8; llm-d-router v0.9–main (deprecated there)", "label-selector-filter", "the older name of label-selector-filter", map[string]paramRule{
			"matchLabels": keep("a Kubernetes label selector"), "matchExpressions": keep("a Kubernetes label selector"),
		}),
		honoured("header-based-testing-filter", "GIE v0.5–v1.5; llm-d-router v0.9–main", nil),
		refused("session-affinity-filter", "llm-d-router v0.9–main", whyNoSession),
		refused("endpoint-attribute-filter", "llm-d-router v0.10–main", "kvroute filters on vLLM's metrics (saturation-filter), not arbitrary endpoint attributes"),
		refused("utilization-filter", "llm-d-router v0.10–main", "use saturation-filter, which drops endpoints whose queue or KV usage reaches a threshold"),
		honoured("topology-affinity-filter", "llm-d-router v0.10–main", map[string]paramRule{
			"minAffinity":          keep("the farthest level kept (host, rack, zone or region; failing open when no candidate is that near)"),
			"topologyProducerName": keep("the topology-extractor whose pod labels are read over the nodes' topology"),
		}),
		honoured("prefix-cache-affinity-filter", "GIE v1.5; llm-d-router v0.9–main", map[string]paramRule{
			"affinityThreshold":                 keep("the share of the request's blocks an endpoint must hold to be sticky"),
			"explorationProbability":            keep("the chance of keeping every candidate (llm-d-router's default, 0; GIE v1.5's was 0.01)"),
			"maxTTFTPenaltyMs":                  keep("how much later a sticky endpoint may start the request than the best other before every candidate is kept (llm-d-router's default, 18000; GIE v1.5's was 5000)"),
			"ttftSource":                        keep("prefillThroughput (the default: prefill tokens in flight over peakPrefillThroughput) or latencyPredictor (the predicted-latency-producer's TTFT)"),
			"peakPrefillThroughput":             keep("an endpoint's prefill rate in tokens a second, for ttftSource prefillThroughput"),
			"maxTokensInFlightPenalty":          keep("how many more prefill tokens in flight a sticky endpoint may have than the best other before every candidate is kept"),
			"prefixMatchInfoProducerName":       drop("kvroute's prefix producer publishes the one PrefixCacheMatchInfo it reads"),
			"latencyPredictionInfoProducerName": drop("kvroute's predicted-latency-producer publishes the one prediction it reads"),
			"inFlightLoadProducerName":          drop(whyInFlight),
		}),
		honoured("slo-headroom-tier-filter", "GIE v1.5; llm-d-router v0.9–main", nil),
		// Pickers and profile handlers.
		honoured("max-score-picker", "GIE v0.5–v1.5; llm-d-router v0.9–main", pickerParams),
		honoured("random-picker", "GIE v0.5–v1.5; llm-d-router v0.9–main", pickerParams),
		honoured("weighted-random-picker", "GIE v1.0–v1.5; llm-d-router v0.9–main", pickerParams),
		honoured("single-profile-handler", "GIE v0.5–v1.5; llm-d-router v0.9–main", nil),
		honoured("pd-profile-handler", "llm-d v0.2–v0.8; llm-d-router v0.9–main (deprecated there)", map[string]paramRule{
			"decodeProfile":               keep("the decode profile's name"),
			"prefillProfile":              keep("the prefill profile's name"),
			"threshold":                   keep("llm-d v0.2–v0.5: split when the decode pod lacks this many prompt tokens (upstream counted the prompt's characters); 0 splits every request"),
			"deciderPluginName":           keep("llm-d v0.6 on: the decider"),
			"hashBlockSize":               drop(whyPDBlocks),
			"prefixPluginName":            drop(whyPDPrefix),
			"prefixPluginType":            drop(whyPDPrefix),
			"prefixMatchInfoProducerName": drop(whyPDPrefix),
			"primaryPort":                 drop(whyDPPort),
		}),
		honoured("disagg-profile-handler", "llm-d v0.7–v0.8; llm-d-router v0.9–main", map[string]paramRule{
			"profiles":                 keep("the decode, prefill and encode profiles' names"),
			"deciders":                 keep("the prefill and encode deciders"),
			"stageOrder":               keep("decode-first or prefill-first"),
			"decodeProfile":            keep("deprecated flat form of profiles.decode"),
			"prefillProfile":           keep("deprecated flat form of profiles.prefill"),
			"encodeProfile":            keep("deprecated flat form of profiles.encode"),
			"prefillDeciderPluginName": keep("deprecated flat form of deciders.prefill"),
			"encodeDeciderPluginName":  keep("deprecated flat form of deciders.encode"),
			"deciderPluginName":        keep("deprecated alias of deciders.prefill"),
		}),
		superseded("prefill-header-handler", "llm-d v0.2–v0.8; llm-d-router v0.9–main (deprecated there)", inertType, whyPDHeaders, map[string]paramRule{
			"prefillProfile": drop(whyPDHeaders),
		}),
		superseded("disagg-headers-handler", "llm-d v0.7–v0.8; llm-d-router v0.9–main (deprecated there)", inertType, whyPDHeaders, map[string]paramRule{
			"prefillProfile": drop(whyPDHeaders), "encodeProfile": drop(whyPDHeaders),
		}),
		honoured("prefix-based-pd-decider", "llm-d v0.6–v0.8; llm-d-router v0.9–main", map[string]paramRule{
			"nonCachedTokens": keep("split when the decode pod lacks at least this many prompt tokens, every tier's blocks counted as cached; 0 never splits"),
			"promptTokens":    keep("the shortest prompt split; 0 sets none"),
		}),
		honoured("always-disagg-pd-decider", "llm-d v0.6–v0.8; llm-d-router v0.9–main", nil),
		honoured("always-disagg-multimodal-decider", "llm-d v0.7–v0.8; llm-d-router v0.9–main", nil),
		refused("p2p-source-producer", "llm-d-router v0.10–main", "kvroute does not name a pod to pull cached KV from (x-kv-cache-source-host-port); the exact index sends a request to the pod that holds its prefix"),
		superseded("data-parallel-profile-handler", "llm-d v0.4–v0.8; llm-d-router v0.9–main (deprecated there)", "single-profile-handler",
			"its one profile runs as single-profile-handler's; a pod's ranks on ports of their own are endpoints of their own, and ranks behind one port are named in x-data-parallel-rank", map[string]paramRule{
				"primaryPort": drop(whyDPPort),
			}),
		refused("header-profile-handler", "llm-d-router v0.10–main", "kvroute picks a profile with single-profile-handler (one profile), or slo-aware-profile-handler (by x-prediction-based-scheduling); not by an arbitrary header"),
		honoured("slo-aware-profile-handler", "GIE v1.2; GIE's slo-prediction-experimental branch (llm-d's SLO guide)", nil),
		superseded("slo-request-tracker", "GIE's slo-prediction-experimental branch (llm-d's SLO guide)", "predicted-latency-producer",
			"kvroute's predicted-latency-producer reads each request's SLO headers, predicts every candidate's TTFT and TPOT, and learns from each response in process", nil),
		{name: "slo-scorer", seen: "GIE's slo-prediction-experimental branch (llm-d's SLO guide)", class: Superseded, target: "latency-scorer",
			why: "kvroute's latency-scorer with strategy least-headroom, upstream's default (HEADROOM_SELECTION_STRATEGY=least): candidates predicted to meet the request's SLO first, the least headroom highest, " +
				"and the least latency for a request without one; it weighs the picks instead of drawing among buckets at random (add slo-headroom-tier-filter to keep only those predicted to meet it)",
			translate: func(string, map[string]json.RawMessage) (json.RawMessage, error) {
				return json.RawMessage(`{"strategy":"least-headroom"}`), nil
			}},
		// Data producers.
		{name: "approx-prefix-cache-producer", seen: "GIE v1.5; llm-d-router v0.9–main", class: Superseded, target: "precise-prefix-cache-producer",
			why: "kvroute's precise-prefix-cache-producer publishes the same PrefixCacheMatchInfo, exactly from KV events where an endpoint's stream is in order and by upstream's approximation elsewhere; " +
				"upstream's routing history (each pick's blocks, per endpoint) is kept beside it by the routing-history-producer, and prefix-cache-scorer places by both, as upstream's places by its history",
			params: approxParams, translate: translateApproxPrefix},
		{name: "precise-prefix-cache-producer", seen: "llm-d-router v0.9–main", class: Superseded,
			why: "kvroute's precise-prefix-cache-producer reads its exact index, fed by the relays over NATS", params: producerParams, speculates: true},
		superseded("token-producer", "llm-d-router v0.9–main", inertType, whyTokenizer, tokenizerParams),
		superseded("tokenizer", "llm-d v0.7–v0.8; llm-d-router v0.9–main (deprecated there)", inertType, whyTokenizer, tokenizerParams),
		superseded("inflight-load-producer", "GIE v1.5; llm-d-router v0.9–main", inertType, whyInFlight, map[string]paramRule{
			"addEstimatedOutputTokens":    only("kvroute's token load is the prompt tokens still to prefill; no estimate of output tokens is added", isNullOrEmpty),
			"maxEstimatedOutputTokens":    drop("read only with addEstimatedOutputTokens, which kvroute does not do"),
			"outputRatio":                 drop("read only with addEstimatedOutputTokens, which kvroute does not do"),
			"prefixMatchInfoProducerName": drop("kvroute takes each request's uncached tokens from its exact prefix match"),
			"syncCrossReplicaState":       only("each kvroute replica counts the requests it routed; no state is synced between replicas", isNullOrEmpty),
		}),
		superseded("session-id-producer", "llm-d-router v0.9–main", inertType, "nothing kvroute runs reads session ids: "+whyNoSession, map[string]paramRule{
			"headerName": drop("nothing reads session ids here"), "cookieName": drop("nothing reads session ids here"),
		}),
		refused("burst-prefix-cache-producer", "llm-d-router v0.10–main", "use speculative-prefix-recorder, which makes a burst of same-prefix requests follow its first pick"),
		refused("mm-embeddings-cache-producer", "llm-d-router v0.9–main", "kvroute does not track multimodal encoder caches"),
		honoured("predicted-latency-producer", "GIE v1.5; llm-d-router v0.9–main", nil),
		// Admission and saturation.
		honoured("utilization-detector", "GIE v1.5; llm-d-router v0.9–main", map[string]paramRule{
			"queueDepthThreshold":       keep("a saturated endpoint's queue"),
			"kvCacheUtilThreshold":      keep("a saturated endpoint's KV usage"),
			"metricsStalenessThreshold": keep("metrics older than this count as saturated"),
			"headroom": {class: Honoured, why: "kvroute's detector allows no burst above its thresholds: set them to the limit wanted",
				refuse: func(raw json.RawMessage) string {
					if isNumberAtMost(0)(raw) {
						return ""
					}
					return "kvroute's detector allows no burst above its thresholds: set them to the limit wanted"
				}},
		}),
		refused("concurrency-detector", "GIE v1.4–v1.5; llm-d-router v0.9–main", "use utilization-detector, which judges saturation from the engines' queues and KV usage"),
		honoured("latency-slo-admitter", "GIE v1.5; llm-d-router v0.9–main", nil),
		refused("probabilistic-admitter", "llm-d-router v0.9–main", "use utilization-detector, which sheds sheddable requests when every candidate is saturated"),
		// Data layer.
		superseded("metrics-data-source", "GIE v1.3–v1.5; llm-d-router v0.9–main", inertType, whyScrape, metricsSource),
		superseded("core-metrics-extractor", "GIE v1.5; llm-d-router v0.9–main", inertType, whyScrape, extractor),
		superseded("model-server-protocol-metrics", "GIE v1.3–v1.4 (renamed core-metrics-extractor)", inertType, whyScrape, extractor),
		superseded("models-data-source", "llm-d v0.6–v0.8; llm-d-router v0.9–main", inertType, "kvroute learns each endpoint's adapters from vllm:lora_requests_info", map[string]paramRule{
			"scheme": drop("kvroute learns adapters from the metrics it scrapes"), "path": drop("kvroute learns adapters from the metrics it scrapes"),
			"insecureSkipVerify": drop("kvroute learns adapters from the metrics it scrapes"), "interval": drop("kvroute learns adapters from the metrics it scrapes"),
			"caCertPath": drop("kvroute learns adapters from the metrics it scrapes"), "clientCertPath": drop("kvroute learns adapters from the metrics it scrapes"),
			"clientKeyPath": drop("kvroute learns adapters from the metrics it scrapes"),
		}),
		superseded("models-data-extractor", "llm-d-router v0.9–main", inertType, "kvroute learns each endpoint's adapters from vllm:lora_requests_info", nil),
		superseded("model-server-protocol-models", "llm-d v0.6–v0.8 (renamed models-data-extractor)", inertType, "kvroute learns each endpoint's adapters from vllm:lora_requests_info", nil),
		superseded("k8s-notification-source", "GIE v1.4–v1.5; llm-d-router v0.9–main", inertType, whyDiscovery, map[string]paramRule{
			"group": drop(whyDiscovery), "version": drop(whyDiscovery), "kind": drop(whyDiscovery),
		}),
		superseded("endpoint-notification-source", "GIE v1.5; llm-d-router v0.9–main", inertType, whyDiscovery, nil),
		superseded("dcgm-data-source", "llm-d-router v0.10–main", inertType, "nothing kvroute runs reads GPU metrics", map[string]paramRule{
			"scheme": drop("nothing reads GPU metrics here"), "path": drop("nothing reads GPU metrics here"), "port": drop("nothing reads GPU metrics here"),
			"insecureSkipVerify": drop("nothing reads GPU metrics here"), "interval": drop("nothing reads GPU metrics here"), "useNodeAddress": drop("nothing reads GPU metrics here"),
		}),
		superseded("dcgm-extractor", "llm-d-router v0.10–main", inertType, "nothing kvroute runs reads GPU metrics", nil),
		honoured("topology-extractor", "llm-d-router v0.10–main", map[string]paramRule{
			"hostname": keep("the pod label read as the host, over the node's kubernetes.io/hostname"),
			"rack":     keep("the pod label read as the rack, over the node's rack label (--topology-rack-label)"),
			"zone":     keep("the pod label read as the zone, over the node's topology.kubernetes.io/zone"),
			"region":   keep("the pod label read as the region, over the node's topology.kubernetes.io/region"),
		}),
		refused("file-discovery", "llm-d-router v0.9–main", "use --endpoints-file, kvroute's static endpoints file"),
		refused("multicluster-file-discovery", "llm-d-router v0.10–main", whyMulticluster),
		refused("multicluster-metrics-data-source", "llm-d-router v0.10–main", whyMulticluster),
		refused("multicluster-metrics-extractor", "llm-d-router v0.10–main", whyMulticluster),
		refused("multicluster-approx-prefix-cache-producer", "llm-d-router v0.10–main", whyMulticluster),
		refused("multicluster-prefix-cache-scorer", "llm-d-router v0.10–main", whyMulticluster),
		refused("multicluster-queue-scorer", "llm-d-router v0.10–main", whyMulticluster),
		refused("multicluster-kv-cache-utilization-scorer", "llm-d-router v0.10–main", whyMulticluster),
		refused("multicluster-session-affinity-filter", "llm-d-router v0.10–main", whyMulticluster),
		refused("cross-replica-publisher", "llm-d-router v0.10–main", "kvroute replicas each follow every pod's KV events; no state is synced between them"),
		refused("local-syncer", "llm-d-router v0.10–main", "kvroute replicas each follow every pod's KV events; no state is synced between them"),
		// Request handling.
		superseded("openai-parser", "GIE v1.5; llm-d-router v0.9–main", inertType, "kvroute parses OpenAI-compatible requests natively", nil),
		superseded("passthrough-parser", "GIE v1.5; llm-d-router v0.9–main", inertType, "kvroute routes requests it does not parse without prefix information, as passthrough does", nil),
		refused("vllmgrpc-parser", "GIE v1.5; llm-d-router v0.9–main", "kvroute parses OpenAI-compatible HTTP requests; vLLM's gRPC API is not parsed"),
		superseded("vllmhttp-parser", "llm-d-router v0.9–main", inertType, "kvroute parses vLLM's HTTP APIs natively, /inference/v1/generate's token ids included", nil),
		refused("sglanghttp-parser", "llm-d-router main", "kvroute parses OpenAI-compatible requests; SGLang's /generate is not parsed"),
		superseded("anthropic-parser", "llm-d-router v0.9–main", inertType, "kvroute parses Anthropic's Messages API natively and renders it as vLLM does", nil),
		refused("vertexai-parser", "llm-d-router v0.9–main", "kvroute parses OpenAI-compatible HTTP requests; Vertex AI's gRPC API is not parsed"),
		refused("request-attribute-reporter", "GIE v1.4–v1.5; llm-d-router v0.9–main", "kvroute writes no CEL-computed attributes of the response's usage into the gateway's dynamic metadata; its usage metrics are on /metrics"),
		refused("destination-endpoint-served-verifier", "GIE v1.2–v1.5; llm-d-router v0.9–main", "the conformance tests' echo of the served endpoint in a response header of its own; kvroute's standalone proxy returns x-gateway-destination-endpoint-served itself, and its ext_proc server sets no response headers"),
		refused("agent-identity", "llm-d-router v0.9–main", "kvroute reads no agent identity headers"),
		refused("disaggregatedset-rollout-screener", "llm-d-router v0.10–main", whyNoPD),
		refused("disaggregatedset-rollout-pod-extractor", "llm-d-router v0.10–main", whyNoPD),
		// Body-based routing, a separate upstream component.
		refused("base-model-to-header", "GIE v1.5 (body-based router)", "a body-based router plugin, not an EPP one"),
		refused("body-field-to-header", "GIE v1.4–v1.5 (body-based router)", "a body-based router plugin, not an EPP one"),
		refused("no-op-plugin", "GIE v1.4 (body-based router)", "a body-based router plugin, not an EPP one"),
	}
	// Flow control: inert, as upstream runs it only with the flowControl
	// feature gate, which kvroute refuses.
	for _, fc := range []struct{ name, seen string }{
		{"global-strict-fairness-policy", "GIE v1.4–v1.5; llm-d-router v0.9–main"},
		{"round-robin-fairness-policy", "GIE v1.4–v1.5; llm-d-router v0.9–main"},
		{"program-aware-fairness", "llm-d-router v0.9–main"},
		{"fcfs-ordering-policy", "GIE v1.4–v1.5; llm-d-router v0.9–main"},
		{"edf-ordering-policy", "GIE v1.4–v1.5; llm-d-router v0.9–main"},
		{"slo-deadline-ordering-policy", "GIE v1.5; llm-d-router v0.9–main"},
		{"static-usage-limit-policy", "GIE v1.5; llm-d-router v0.9–main"},
		{"priority-holdback-policy", "llm-d-router v0.10–main"},
		{"soft-reflective-ceiling-policy", "llm-d-router v0.10–main"},
		{"sheddable-eviction-filter", "llm-d-router v0.9–main"},
		{"eviction-sheddable-filter", "GIE v1.5"},
		{"priority-then-time-eviction-order-policy", "llm-d-router v0.9–main"},
		{"eviction-priority-then-time-ordering", "GIE v1.5"},
	} {
		types = append(types, upstreamType{name: fc.name, seen: fc.seen, class: Superseded, target: inertType,
			why:    "a flow-control policy, " + whyNoFlowControl,
			params: anyParams})
	}
	out := make(map[string]upstreamType, len(types))
	for _, t := range types {
		if _, dup := out[t.name]; dup {
			panic("upstream type listed twice: " + t.name)
		}
		out[t.name] = t
	}
	return out
}()

// anyParams marks a type whose parameters are all accepted unread (an
// inert type's): the loader checks nothing of them.
var anyParams = map[string]paramRule{"*": drop("not read: the plugin does nothing here")}

// translatePrefixScorer passes the scorer's parameters on, but for llm-d's
// mode: cache_tracking scored what the KV events say alone, estimate (and
// every other era of the scorer) by where requests were routed, which
// routingHistory keeps.
func translatePrefixScorer(name string, up map[string]json.RawMessage) (json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	for k, v := range up {
		if k != "mode" {
			out[k] = v
		}
	}
	if raw, ok := up["mode"]; ok && isOneOf("cache_tracking")(raw) {
		if _, set := out["routingHistory"]; !set {
			out["routingHistory"] = json.RawMessage("false")
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return json.Marshal(out)
}

// translateApproxPrefix maps upstream's approximate producer's honoured
// parameters onto kvroute's prefix producer, which keeps upstream's
// approximation for endpoints without an in-order event stream: the block
// size and the match cap (in blocks, or in tokens, which wins as upstream)
// tune that fallback.
func translateApproxPrefix(name string, up map[string]json.RawMessage) (json.RawMessage, error) {
	const typ = ApproxPrefixProducerType
	out := map[string]int{}
	get := func(key string) (int, bool, error) {
		raw, ok := up[key]
		if !ok || isNullOrEmpty(raw) {
			return 0, false, nil
		}
		var v int
		if err := json.Unmarshal(raw, &v); err != nil {
			return 0, false, fmt.Errorf("plugin %q (type %s): %s is not a whole number: %w", name, typ, key, err)
		}
		return v, true, nil
	}
	approxBlockSize := producer.DefaultParams().ApproxBlockSizeTokens
	if v, ok, err := get("blockSizeTokens"); err != nil {
		return nil, err
	} else if ok {
		if v < 1 {
			return nil, fmt.Errorf("plugin %q (type %s): blockSizeTokens = %d, want ≥ 1", name, typ, v)
		}
		out["approxBlockSizeTokens"], approxBlockSize = v, v
	}
	if v, ok, err := get("maxPrefixBlocksToMatch"); err != nil {
		return nil, err
	} else if ok {
		if v < 1 {
			return nil, fmt.Errorf("plugin %q (type %s): maxPrefixBlocksToMatch = %d, want ≥ 1", name, typ, v)
		}
		out["approxMaxBlocks"] = v
	}
	if v, ok, err := get("maxPrefixTokensToMatch"); err != nil {
		return nil, err
	} else if ok && v > 0 {
		out["approxMaxBlocks"] = max(v/approxBlockSize, 1)
	}
	return json.Marshal(out)
}
