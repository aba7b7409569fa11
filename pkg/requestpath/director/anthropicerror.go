package director

import (
	"encoding/json"
	"net/http"
	"strings"
)

// anthropicError is Anthropic's error shape, which Messages clients parse.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// ErrorBodyFor is ErrorBody in the error shape of the API path names:
// Anthropic's {"type":"error","error":{"type":...,"message":...}} for the
// Messages API, OpenAI's for every other.
func ErrorBodyFor(path string, status int, err error) []byte {
	if !isMessagesPath(path) {
		return ErrorBody(status, err)
	}
	var e anthropicError
	e.Type = "error"
	e.Error.Type = anthropicErrorType(status)
	e.Error.Message = err.Error()
	b, mErr := json.Marshal(&e)
	if mErr != nil {
		return []byte(`{"type":"error","error":{"type":"api_error","message":"internal error"}}`)
	}
	return b
}

// isMessagesPath: the Messages API and its count_tokens, matched as the
// request parser matches them (as suffixes, before any query).
func isMessagesPath(path string) bool {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	return strings.HasSuffix(path, "/v1/messages") || strings.HasSuffix(path, "/v1/messages/count_tokens")
}

// anthropicErrorType names status as Anthropic's error types do.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout, http.StatusRequestTimeout:
		return "timeout_error"
	}
	return "api_error"
}
