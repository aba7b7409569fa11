// Package tokenizer turns prompts into the exact token ids a model server
// computes, in process: it loads a Hugging Face tokenizer.json (byte-level
// BPE as Llama 3, Qwen 2/3 and GPT-style models use it), renders chat
// templates from tokenizer_config.json, and caches the ids of text between
// special tokens so that repeated system prompts and earlier turns cost a hash
// lookup.
//
// The pipeline follows the reference library step by step, because any
// deviation changes the ids and with them every prefix key: added tokens are
// split out of the raw text first; each remaining segment is normalized,
// pre-tokenized (a hand-written scanner for the known Split patterns, a
// backtracking regexp for any other), mapped byte-level and merged by BPE
// rank; the post-processor adds BOS-style tokens when asked to.
//
// It is a library of its own: it reads its files and chat JSON itself (the
// chat's with pkg/jsonscan) and knows no more of kvroute than the parsed
// request's chat (pkg/request).
// The request path adapts it (pkg/requestpath/tokenize/localtokenizer), and
// kvctl uses it as it is.
//
// Its loaded tables (vocabulary, merges, the word cache) are flat arrays of
// bytes and integers with offsets and open-addressing hash tables, holding
// no pointers: a process that keeps a 150k-token vocabulary loaded pays
// the garbage collector nothing to scan for it (BenchmarkLoadedHeap).
package tokenizer
