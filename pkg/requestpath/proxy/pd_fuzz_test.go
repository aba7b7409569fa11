package proxy

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzTransferOf reads arbitrary prefill answers: each is taken or
// refused with an error, never a panic, and what is taken is a JSON
// object the decode leg can carry.
func FuzzTransferOf(f *testing.F) {
	for _, s := range []string{
		`{"id":"c","choices":[{"text":" w0"}],"usage":{"prompt_tokens":5,"completion_tokens":1},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[0,1],"remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":8000,"tp_size":1}}`,
		`{"kv_transfer_params":null}`, `{"kv_transfer_params":[1]}`, `{"kv_transfer_params":{"remote_port":{}}}`, `[]`, ``, `{"kv_transfer_params": {} }`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		kv, err := transferOf(answer)
		if err != nil {
			return
		}
		var m map[string]json.RawMessage
		if len(kv) == 0 || !bytes.HasPrefix(kv, []byte("{")) || json.Unmarshal(kv, &m) != nil {
			t.Errorf("took %q from %q: not an object", kv, answer)
		}
	})
}
