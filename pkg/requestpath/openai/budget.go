package openai

// DecodedBytesPerBodyByte is the memory a request body is charged per raw
// byte while it is parsed and routed, by every server that bounds the
// bodies it holds: the raw bytes themselves, plus what parsing makes of
// them. The ext_proc package's BenchmarkDecodedBytesPerBodyByte measures
// the director's allocations per body byte at 1.0 for a text prompt, 0.64
// for token ids (completions and generate), 2.0 for one-digit token ids,
// 7.1 for chat messages (each message becomes a map), 9.5 for Messages
// content blocks and 9.6 for Responses items (converted to chat messages,
// which are then read as a chat's); 10 covers the worst of them, the raw
// bytes, and the token ids a tokenizer adds (4 bytes a token).
const DecodedBytesPerBodyByte = 10
