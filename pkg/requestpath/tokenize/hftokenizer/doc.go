// Package hftokenizer turns prompts into the exact token ids a model server
// computes, inside the EPP: it loads a Hugging Face tokenizer.json (byte-level
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
// Local adapts per-model tokenizers to tokenize.Tokenizer, falling back to a
// model server's /tokenize for models without a local tokenizer and comparing
// a sample of answers against it to count drift.
package hftokenizer
