// Package remotetokenizer finds a prompt's token ids by asking a model
// server's /tokenize, as vLLM serves it, with a cache and single-flight for
// repeated prompts: the fallback for models without an in-process tokenizer,
// and the reference its drift check compares against.
package remotetokenizer
