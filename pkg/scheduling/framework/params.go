package framework

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrInvalidParams marks a plugin's parameters as unusable: malformed,
// unknown, or out of range.
var ErrInvalidParams = errors.New("invalid plugin parameters")

// DecodeParams decodes raw into dst strictly: an unknown field is an error,
// as is trailing data. Empty or null raw leaves dst as it is, so callers fill
// dst with defaults first. Errors wrap ErrInvalidParams and name the plugin.
func DecodeParams(pluginType, name string, raw json.RawMessage, dst any) error {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return fmt.Errorf("%w: plugin %q (type %s): %w", ErrInvalidParams, name, pluginType, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: plugin %q (type %s): trailing data after parameters", ErrInvalidParams, name, pluginType)
	}
	return nil
}

// ParamError reports an out-of-range parameter of a plugin.
func ParamError(pluginType, name, format string, args ...any) error {
	return fmt.Errorf("%w: plugin %q (type %s): %s", ErrInvalidParams, name, pluginType, fmt.Sprintf(format, args...))
}
