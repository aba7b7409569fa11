package director

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// errorBody is the OpenAI error shape that clients of vLLM and OpenAI
// already parse.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   string `json:"param,omitempty"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// ErrorJSON is the body answered with status for a refused request:
// {"error":{"message":...,"type":...,"code":status}}, the type named as
// OpenAI's client libraries name it (BadRequestError, RateLimitError, ...).
func ErrorJSON(status int, message string) []byte {
	return errorJSON(status, message, "")
}

// ErrorBody is ErrorJSON for a request-path error: its message, and the
// request field it concerns when it names one (vLLM's "param").
func ErrorBody(status int, err error) []byte {
	var e *Error
	if errors.As(err, &e) {
		return errorJSON(status, err.Error(), e.Param)
	}
	return errorJSON(status, err.Error(), "")
}

func errorJSON(status int, message, param string) []byte {
	var e errorBody
	e.Error.Message = message
	e.Error.Param = param
	e.Error.Type = errorType(status)
	e.Error.Code = status
	b, err := json.Marshal(&e)
	if err != nil {
		// Marshalling strings and an int cannot fail; keep the error path total anyway.
		return []byte(`{"error":{"message":"internal error","type":"InternalServerError","code":500}}`)
	}
	return b
}

func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLargeError"
	case http.StatusTooManyRequests:
		return "RateLimitError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		return strings.ReplaceAll(http.StatusText(status), " ", "") + "Error"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "APIError"
}
