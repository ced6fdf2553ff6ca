package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ErrAttemptsExhausted is the reason of a GaveUpError when the client made
// as many attempts as WithMaxAttempts allows.
var ErrAttemptsExhausted = errors.New("maximum number of attempts reached")

// ErrRetryWindowExhausted is the reason of a GaveUpError when the next
// attempt could only start after the retry horizon (WithRetryFor).
var ErrRetryWindowExhausted = errors.New("retry horizon reached")

// ErrAttemptTimeout is the error of an attempt that got no answer within the
// per-attempt timeout (WithAttemptTimeout). Such an attempt is retried: the
// service may have done the work, and the retry's replay says so.
var ErrAttemptTimeout = errors.New("no answer within the per-attempt timeout")

// Attempts returns how many HTTP requests the call that returned err made,
// for any error this package returns (0 when none was sent).
func Attempts(err error) int {
	var a interface{ Attempts() int }
	if errors.As(err, &a) {
		return a.Attempts()
	}
	return 0
}

// Problem is an RFC 9457 problem details object, as the service sends with
// every error.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Field names the offending request field of a validation error.
	Field string `json:"field,omitempty"`
	// ChargeID and DeclineCode are set on card-declined problems.
	ChargeID    string `json:"charge_id,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
	// RequestID is the service's id of the request it answered (absent
	// from a stored answer, such as a decline: see APIError.RequestID).
	RequestID string `json:"request_id,omitempty"`
}

// Slug returns the last path segment of the problem type, such as
// "card-declined" or "request-in-progress": the part to switch on.
func (p Problem) Slug() string {
	t := strings.TrimRight(p.Type, "/")
	if i := strings.LastIndexByte(t, '/'); i >= 0 {
		return t[i+1:]
	}
	return t
}

// APIError is an answer of the service that is not a success. The more
// specific errors (DeclinedError, KeyReusedError, ValidationError,
// UnauthorizedError) wrap one, so errors.As(err, &apiErr) finds the problem
// details of any of them.
type APIError struct {
	// StatusCode is the HTTP status; 0 when the client refused to send the
	// request (see ValidationError).
	StatusCode int
	// Problem holds the problem details. When the answer was not
	// problem+json (a proxy's error page), they are made up from the status
	// and the start of the body.
	Problem Problem
	// RetryAfter is the delay the Retry-After header asked for, if any.
	RetryAfter time.Duration
	// Replayed is true when the answer was the service's stored response
	// for this key (Idempotent-Replayed: true): a decline seen again.
	Replayed bool
	// RequestID is the Request-Id the service gave this answer (req_…):
	// quote it to the service's operators, who find the request's log line
	// by it. Empty when the request was not sent or the answer came from a
	// proxy.
	RequestID string

	attempts int
}

// Error implements error.
func (e *APIError) Error() string {
	if e.StatusCode == 0 {
		return fmt.Sprintf("chargeonce: %s (not sent)", e.Problem.Detail)
	}
	if e.RequestID != "" {
		return fmt.Sprintf("chargeonce: %d %s: %s (request %s)", e.StatusCode, e.Problem.Slug(), e.Problem.Detail, e.RequestID)
	}
	return fmt.Sprintf("chargeonce: %d %s: %s", e.StatusCode, e.Problem.Slug(), e.Problem.Detail)
}

// Slug returns the problem type's slug; see Problem.Slug.
func (e *APIError) Slug() string { return e.Problem.Slug() }

// Attempts returns how many HTTP requests the call made.
func (e *APIError) Attempts() int { return e.attempts }

// DeclinedError is a 402 card-declined: the acquirer refused the charge. It
// is final, and never retried: the same key would only replay the decline,
// and a new key is a new payment the customer has not asked for.
type DeclinedError struct {
	ChargeID    string
	DeclineCode string
	*APIError
}

// Error implements error.
func (e *DeclinedError) Error() string {
	return fmt.Sprintf("chargeonce: charge %s declined: %s", e.ChargeID, e.DeclineCode)
}

// Unwrap returns the underlying APIError.
func (e *DeclinedError) Unwrap() error { return e.APIError }

// KeyReusedError is a 422 idempotency-key-reused: the key was already used
// for a different request. It is a bug in the caller (two intents sharing a
// key), never retried.
type KeyReusedError struct{ *APIError }

// Unwrap returns the underlying APIError.
func (e *KeyReusedError) Unwrap() error { return e.APIError }

// ValidationError is a 400 (validation-failed, missing- or
// invalid-idempotency-key) or a 413 payload-too-large: the request itself is
// wrong, and sending it again cannot help. Problem.Field names the offending
// field when there is one. An idempotency key the client cannot send is
// reported the same way, with StatusCode 0 and no request made.
type ValidationError struct{ *APIError }

// Unwrap returns the underlying APIError.
func (e *ValidationError) Unwrap() error { return e.APIError }

// UnauthorizedError is a 401: the API key is missing or unknown. Not
// retried.
type UnauthorizedError struct{ *APIError }

// Unwrap returns the underlying APIError.
func (e *UnauthorizedError) Unwrap() error { return e.APIError }

// ProcessingError is a 202: the service recorded the charge but does not
// know the acquirer's outcome yet. CreateCharge retries it with the same
// key (each retry makes the service ask the acquirer again, by the same
// reference, so no retry can charge twice); it only shows up as the Last
// error of a GaveUpError.
type ProcessingError struct {
	// Charge is the charge as the 202 showed it (status processing).
	Charge   *Charge
	attempts int
}

// Error implements error.
func (e *ProcessingError) Error() string {
	return fmt.Sprintf("chargeonce: charge %s is still processing: the acquirer's outcome is not known yet", e.Charge.ID)
}

// Attempts returns how many HTTP requests the call made.
func (e *ProcessingError) Attempts() int { return e.attempts }

// GaveUpError is returned when the client stopped retrying before it got a
// final answer: the context ended (or its deadline would pass before the
// next attempt could start), the retry horizon passed, or the attempts ran
// out. For CreateCharge the outcome is then unknown — the charge may have
// been made — and the way to learn it is to call again later with
// ChargeRequest.IdempotencyKey set to Key and the same request: Key is the
// intent's key also when CreateCharge made it up. Keep it with the order.
//
// errors.Is(err, context.DeadlineExceeded) (or context.Canceled, or
// ErrAttemptsExhausted) matches Reason, and errors.As finds the last
// attempt's error (an *APIError for a 409, 429 or 5xx, a *ProcessingError
// for a 202, a transport error) through Last.
type GaveUpError struct {
	// Method and Path name the call.
	Method, Path string
	// Key is the idempotency key of a CreateCharge call: resume with it.
	Key string
	// Reason is ctx.Err(), ErrRetryWindowExhausted or ErrAttemptsExhausted.
	Reason error
	// Last is the error of the last attempt that finished; nil when the
	// context ended during the first.
	Last     error
	attempts int
}

// Error implements error.
func (e *GaveUpError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chargeonce: %s %s: gave up after %d attempt", e.Method, e.Path, e.attempts)
	if e.attempts != 1 {
		b.WriteByte('s')
	}
	fmt.Fprintf(&b, ": %v", e.Reason)
	if e.Last != nil {
		fmt.Fprintf(&b, "; last error: %v", e.Last)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " (the outcome is unknown: call again with Idempotency-Key %s to learn it)", e.Key)
	}
	return b.String()
}

// Unwrap returns Reason and Last.
func (e *GaveUpError) Unwrap() []error {
	if e.Last == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Last}
}

// Attempts returns how many HTTP requests the call made, including one the
// context cut short.
func (e *GaveUpError) Attempts() int { return e.attempts }

// finalError is an error that ended a call without an answer from the
// service worth retrying (a certificate the client does not trust, an
// undecodable success). It carries the attempts made.
type finalError struct {
	err      error
	attempts int
}

func (e *finalError) Error() string { return e.err.Error() }
func (e *finalError) Unwrap() error { return e.err }
func (e *finalError) Attempts() int { return e.attempts }

// maxProblemDetail bounds the part of a non-problem body shown as a detail.
const maxProblemDetail = 200

// responseError turns a final or last non-success answer into its error.
func responseError(ex *exchange, attempts int) error {
	if ex.status == http.StatusAccepted {
		var ch Charge
		if err := json.Unmarshal(ex.body, &ch); err != nil {
			ch.Status = StatusProcessing
		}
		ch.Attempts = attempts
		return &ProcessingError{Charge: &ch, attempts: attempts}
	}
	e := &APIError{
		StatusCode: ex.status,
		RetryAfter: ex.retryAfter,
		Replayed:   ex.replayed,
		RequestID:  ex.requestID,
		attempts:   attempts,
	}
	if err := json.Unmarshal(ex.body, &e.Problem); err != nil || e.Problem.Type == "" {
		detail := strings.TrimSpace(string(ex.body))
		if len(detail) > maxProblemDetail {
			detail = detail[:maxProblemDetail] + "…"
		}
		if detail == "" {
			detail = "(empty body)"
		}
		e.Problem = Problem{Type: "about:blank", Title: http.StatusText(ex.status), Status: ex.status, Detail: detail}
	}
	if e.RequestID == "" {
		e.RequestID = e.Problem.RequestID
	}
	switch ex.status {
	case http.StatusPaymentRequired:
		return &DeclinedError{ChargeID: e.Problem.ChargeID, DeclineCode: e.Problem.DeclineCode, APIError: e}
	case http.StatusUnprocessableEntity:
		return &KeyReusedError{e}
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return &ValidationError{e}
	case http.StatusUnauthorized:
		return &UnauthorizedError{e}
	}
	return e
}

// localValidationError reports a request the client refused to send.
func localValidationError(slug, title, detail string) error {
	return &ValidationError{&APIError{Problem: Problem{
		Type:   "https://chargeonce.dev/problems/" + slug,
		Title:  title,
		Status: http.StatusBadRequest,
		Detail: detail,
	}}}
}
