package epp

import (
	"log/slog"
	"testing"

	"github.com/kvroute/kvroute/pkg/requestpath/tokenize/hftokenizer"
)

const tinyTokenizer = "../requestpath/tokenize/hftokenizer/testdata/tiny"

func TestTokenizerFilesAddToTheGivenTokenizers(t *testing.T) {
	t.Parallel()
	tok, err := hftokenizer.Load(tinyTokenizer, hftokenizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	given := map[string]*hftokenizer.Tokenizer{"x": tok}
	o := RequestPathOptions{Tokenizers: given, TokenizerFiles: []string{"m=" + tinyTokenizer}}
	if err := loadTokenizerFiles(&o); err != nil {
		t.Fatal(err)
	}
	if len(o.Tokenizers) != 2 || o.Tokenizers["x"] != tok || o.Tokenizers["m"] == nil {
		t.Errorf("tokenizers %v, want x's given one and m's loaded", o.Tokenizers)
	}
	if len(given) != 1 {
		t.Errorf("the caller's map was written to: %v", given)
	}
	for _, tt := range []struct {
		name string
		o    RequestPathOptions
	}{
		{"a model given a tokenizer twice", RequestPathOptions{Tokenizers: map[string]*hftokenizer.Tokenizer{"m": tok}, TokenizerFiles: []string{"m=" + tinyTokenizer}}},
		{"a file named without its model", RequestPathOptions{TokenizerFiles: []string{tinyTokenizer}}},
		{"a file that is not there", RequestPathOptions{TokenizerFiles: []string{"m=" + tinyTokenizer + "/nothing-here"}}},
	} {
		if err := loadTokenizerFiles(&tt.o); err == nil {
			t.Errorf("%s: loaded", tt.name)
		}
	}
}

func TestNewTakesAConfigurationByNameAndNotBesideAnother(t *testing.T) {
	t.Parallel()
	base := Options{Pool: "p", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", NoRecovery: true,
		Logger: slog.New(slog.DiscardHandler)}
	for _, tt := range []struct {
		name string
		edit func(*Options)
		ok   bool
	}{
		{"a known name", func(o *Options) { o.ConfigName = "upstream-weights" }, true},
		{"an unknown name", func(o *Options) { o.ConfigName = "no-such-config" }, false},
		{"a name beside a text", func(o *Options) { o.ConfigName, o.ConfigText = "upstream-weights", "plugins: []" }, false},
		{"a name beside a file", func(o *Options) { o.ConfigName, o.ConfigFile = "upstream-weights", "/x.yaml" }, false},
	} {
		o := base
		tt.edit(&o)
		e, err := New(o)
		if (err == nil) != tt.ok {
			t.Errorf("%s: err %v", tt.name, err)
		}
		if e != nil {
			e.Close()
		}
	}
}
