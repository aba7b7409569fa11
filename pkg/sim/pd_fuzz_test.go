package sim

import (
	"encoding/json"
	"testing"
)

// FuzzKVTransferParams reads arbitrary kv_transfer_params: each is
// accepted or refused with an error, never a panic, and an accepted
// remote prefill always names where to pull from.
func FuzzKVTransferParams(f *testing.F) {
	for _, s := range []string{
		`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`,
		`{"do_remote_prefill":true,"remote_block_ids":[[0,1],[2]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":"80","tp_size":2}`,
		`null`, `{}`, `[`, `{"remote_port":-1}`, `{"remote_port":1e400}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := ParseKVTransferParams(json.RawMessage(raw))
		if err != nil || p == nil {
			return
		}
		if p.DoRemotePrefill && (p.RemoteHost == "" || p.RemotePort < 1 || p.RemotePort > 65535 || p.RemoteRequestID == "") {
			t.Errorf("accepted a remote prefill that names no prefill engine: %+v", p)
		}
		if p.DoRemotePrefill && p.DoRemoteDecode {
			t.Errorf("accepted both directions: %s", raw)
		}
	})
}
