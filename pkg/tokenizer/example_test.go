package tokenizer_test

import (
	"encoding/json"
	"fmt"
	"log"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/tokenizer"
)

// A tokenizer is loaded from a model's tokenizer directory once and then
// used from any goroutine.
func ExampleLoad() {
	tok, err := tokenizer.Load("testdata/tiny", tokenizer.Options{Name: "tiny"})
	if err != nil {
		log.Fatal(err)
	}
	// With special tokens, as a completion prompt gets them: this model's
	// post-processor puts <s> before the text and </s> after it.
	ids, err := tok.Encode("hello world!", true)
	if err != nil {
		log.Fatal(err)
	}
	text, _ := tok.Decode(ids[1 : len(ids)-1])
	fmt.Println(ids, string(text))
	// Output: [264 259 32 119 111 262 263 265] hello world!
}

// A chat request's messages are rendered with the model's chat template
// and tokenized as the model server's chat endpoint does.
func ExampleTokenizer_EncodeChat() {
	tok, err := tokenizer.Load("testdata/tiny", tokenizer.Options{})
	if err != nil {
		log.Fatal(err)
	}
	chat := &request.Chat{
		Messages:            json.RawMessage(`[{"role":"user","content":"hello"}]`),
		AddGenerationPrompt: true,
	}
	text, err := tok.RenderChat(chat)
	if err != nil {
		log.Fatal(err)
	}
	ids, err := tok.EncodeChat(chat)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q %v\n", text, ids)
	// Output: "<s>user: hello<|sep|>assistant:" [264 117 115 101 114 58 32 259 266 97 115 115 105 115 116 97 110 116 58]
}
