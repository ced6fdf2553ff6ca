package chargeonce

import (
	"errors"
	"fmt"
	"time"
)

// Error codes. The HTTP layer maps each to a status and a problem type in one
// table (httpapi/problem.go); stores and the engine only ever speak codes.
const (
	EINVALID      = "validation-failed"
	EMISSINGKEY   = "missing-idempotency-key"
	EINVALIDKEY   = "invalid-idempotency-key"
	ETOOLARGE     = "payload-too-large"
	EUNAUTHORIZED = "unauthorized"
	ENOTFOUND     = "not-found"
	EINPROGRESS   = "request-in-progress"
	EKEYREUSED    = "idempotency-key-reused"
	EDECLINED     = "card-declined"
	ESTALE        = "stale-attempt"
	EUNAVAILABLE  = "unavailable"
	EINTERNAL     = "internal-error"
	EMETHOD       = "method-not-allowed"

	// EOVERLOADED: every acquirer slot stayed busy past the admission wait;
	// nothing was kept for the key, and a retry after RetryAfter starts
	// afresh.
	EOVERLOADED = "overloaded"

	// ERATELIMITED: the merchant is over its own rate, or holds its share
	// of the acquirer slots while other merchants need them; nothing was
	// kept for the key, and a retry after RetryAfter starts afresh.
	ERATELIMITED = "rate-limited"
)

// Error is an error that carries a code the caller can act on.
type Error struct {
	// Code is one of the E* constants.
	Code string
	// Message is safe to show to the API client.
	Message string
	// Field names the offending request field, when there is one.
	Field string
	// RetryAfter, when positive, is when the client should come back (409
	// from the remaining lease, 503 when shedding); the HTTP layer sends it
	// as Retry-After.
	RetryAfter time.Duration
}

// Error implements error.
func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("chargeonce: %s: %s (field %s)", e.Code, e.Message, e.Field)
	}
	return fmt.Sprintf("chargeonce: %s: %s", e.Code, e.Message)
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// FieldError returns a validation error that names the offending field.
func FieldError(field, format string, args ...any) *Error {
	return &Error{Code: EINVALID, Field: field, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, or EINTERNAL.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EINTERNAL
}

// ErrorMessage returns the client-safe message of err. Errors without a code
// are internal and their text is not shown to clients.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

// ErrorRetryAfter returns the RetryAfter of the first *Error in err's chain,
// or zero.
func ErrorRetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}
