package stripetest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Manual capture, as Stripe does it: a PaymentIntent created with
// capture_method=manual whose confirmation succeeds waits in
// requires_capture (amount_capturable = amount, nothing received);
// POST /v1/payment_intents/{id}/capture takes amount_to_capture (at most
// amount_capturable; all of it by default) and metadata, and leaves it
// succeeded; POST /v1/payment_intents/{id}/cancel takes
// cancellation_reason and leaves it canceled. A capture of a PaymentIntent
// that is not in requires_capture, and a cancel of one that succeeded or
// is canceled, are refused with 400 payment_intent_unexpected_state,
// carrying the PaymentIntent, as Stripe's are. Both replay their
// Idempotency-Key (and refuse it with other parameters), and follow the
// PaymentIntent's payment method as refunds do, or the one FaultOperation
// gave their key: pm_fail_before, pm_fail_after, pm_drop_after,
// pm_rate_limited and pm_unavailable strike the first request of each key
// (and every one within Options.FaultFor of it).

// FaultOperation makes the capture or cancel whose Idempotency-Key is
// reference fail as the payment method pm does (pm_fail_before, ...),
// whatever its PaymentIntent's payment method: an authorization can only
// be made by a request the fault spared.
func (f *Fake) FaultOperation(reference, pm string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opFaults == nil {
		f.opFaults = map[string]string{}
	}
	f.opFaults[reference] = pm
}

// authorizeOrCapture sets what the capture method makes of a PaymentIntent
// whose confirmation succeeded: held (manual) or received. f.mu is held.
func authorizeOrCapture(pi *PaymentIntent, method string) {
	pi.CaptureMethod = method
	if method == "" {
		pi.CaptureMethod = "automatic"
	}
	if pi.Status != "succeeded" {
		return
	}
	pi.LatestCharge = "ch_fake_" + strings.TrimPrefix(pi.ID, "pi_fake")
	if pi.CaptureMethod == "manual" {
		pi.Status, pi.AmountCapturable = "requires_capture", pi.Amount
		return
	}
	pi.AmountReceived = pi.Amount
}

// keyAnsweredLocked answers a request whose Idempotency-Key is taken, as
// Stripe does: the first answer replayed (lost again while a fault after
// the commit lasts: the outage is between the caller and Stripe), an
// idempotency_error for other parameters, 409 while the first request
// runs. A key older than Options.KeyTTL is forgotten first. f.mu is held;
// when it answers, it releases f.mu and reports true.
func (f *Fake) keyAnsweredLocked(w http.ResponseWriter, key, params, pm string, faulty bool, now time.Time) bool {
	if a := f.keys[key]; a != nil && f.opts.KeyTTL > 0 && now.Sub(a.since) > f.opts.KeyTTL {
		delete(f.keys, key) // Stripe has forgotten the key
	}
	if a := f.keys[key]; a != nil {
		f.mu.Unlock()
		switch {
		case a.params != params:
			writeError(w, http.StatusBadRequest, apiError{Type: "idempotency_error",
				Message: "Keys for idempotent requests can only be used with the same parameters they were first used with."})
		case faulty && (pm == PMFailAfter || pm == PMDropAfter):
			loseAnswer(w, pm)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			writeRaw(w, a.status, a.body)
		}
		return true
	}
	if f.inflight[key] {
		f.mu.Unlock()
		writeError(w, http.StatusConflict, apiError{Type: "idempotency_error", Code: "idempotency_key_in_use",
			Message: "There is currently another in-progress request using this Stripe-Idempotency-Key."})
		return true
	}
	return false
}

// intentLocked returns the PaymentIntent with id (nil when there is none)
// and its payment method, whose faults its refunds, captures and cancels
// take. f.mu is held.
func (f *Fake) intentLocked(id string) (*PaymentIntent, string) {
	for _, pi := range f.intents {
		if pi.ID == id {
			return pi, pi.PaymentMethod
		}
	}
	return nil, ""
}

// faultyLocked reports whether a fault payment method strikes a request
// of what seenKey names: its first one, and every one within
// Options.FaultFor of it. f.mu is held.
func (f *Fake) faultyLocked(seenKey string, now time.Time) bool {
	first, seen := f.seen[seenKey]
	if !seen {
		first = now
		f.seen[seenKey] = now
	}
	return !seen || now.Sub(first) < f.opts.FaultFor
}

// answerLocked answers a request that ran: its answer kept under its key
// (unless a 5xx, which Stripe does not keep), then lost while a fault
// after the commit strikes, else written. f.mu is held; it releases it.
func (f *Fake) answerLocked(w http.ResponseWriter, key, params, pm string, faulty bool, status int, answer any, now time.Time) {
	body, _ := json.Marshal(answer)
	if key != "" && status < 500 {
		f.keys[key] = &savedAnswer{params: params, status: status, body: body, since: now}
	}
	f.mu.Unlock()
	if faulty && (pm == PMFailAfter || pm == PMDropAfter) {
		loseAnswer(w, pm)
		return
	}
	writeRaw(w, status, body)
}

// received is what a succeeded PaymentIntent took, and so what its refunds
// can give back: the amount, or what the capture of an authorization took.
func received(pi *PaymentIntent) int64 {
	if pi.CaptureMethod == "manual" {
		return pi.AmountReceived
	}
	return pi.Amount
}

// settleAuthorization answers POST /v1/payment_intents/{id}/capture and
// /cancel.
func (f *Fake) settleAuthorization(w http.ResponseWriter, r *http.Request, rest string) {
	id, action, _ := strings.Cut(rest, "/")
	if action != "capture" && action != "cancel" {
		writeError(w, http.StatusNotFound, apiError{Type: "invalid_request_error", Message: "Unrecognized request URL"})
		return
	}
	form := r.PostForm
	key := r.Header.Get("Idempotency-Key")
	params := action + ":" + id + ":" + form.Encode()
	now := time.Now()

	f.mu.Lock()
	pi, pm := f.intentLocked(id)
	if fault, ok := f.opFaults[key]; ok {
		pm = fault
	}
	faulty := f.faultyLocked(action+":"+key, now)
	if key != "" && f.keyAnsweredLocked(w, key, params, pm, faulty, now) {
		return
	}
	switch {
	case faulty && pm == PMFailBefore:
		f.mu.Unlock()
		writeError(w, http.StatusInternalServerError, apiError{Type: "api_error", Message: "injected fault before commit"})
		return
	case faulty && pm == PMRateLimited:
		f.mu.Unlock()
		f.retryAfter(w)
		writeError(w, http.StatusTooManyRequests, apiError{Type: "invalid_request_error", Code: "rate_limit", Message: "Too many requests"})
		return
	case faulty && pm == PMUnavailable:
		f.mu.Unlock()
		f.retryAfter(w)
		writeError(w, http.StatusServiceUnavailable, apiError{Type: "api_error", Message: "injected outage before commit"})
		return
	}
	var status int
	var answer any
	if action == "capture" {
		status, answer = f.captureLocked(pi, id, form, now)
	} else {
		status, answer = f.cancelLocked(pi, id, form.Get("cancellation_reason"), now)
	}
	f.answerLocked(w, key, params, pm, faulty, status, answer, now)
}

// unexpectedState is Stripe's refusal of a capture or cancel of a
// PaymentIntent in the wrong state, carrying the PaymentIntent.
func unexpectedState(pi *PaymentIntent, msg string) (int, any) {
	cp := *pi
	return http.StatusBadRequest, map[string]any{"error": apiError{Type: "invalid_request_error", Code: "payment_intent_unexpected_state",
		Message: msg, PaymentIntent: &cp}}
}

func missingIntent(id string) (int, any) {
	return http.StatusNotFound, map[string]any{"error": apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "intent",
		Message: fmt.Sprintf("No such payment_intent: '%s'", id)}}
}

// captureLocked captures pi. f.mu is held.
func (f *Fake) captureLocked(pi *PaymentIntent, id string, form map[string][]string, now time.Time) (int, any) {
	if pi == nil {
		return missingIntent(id)
	}
	f.settle(pi, now)
	if pi.Status != "requires_capture" {
		return unexpectedState(pi, fmt.Sprintf("This PaymentIntent could not be captured because it has a status of %s. Only a PaymentIntent with one of the following statuses may be captured: requires_capture.", pi.Status))
	}
	amount := pi.AmountCapturable
	if v := first(form, "amount_to_capture"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return http.StatusBadRequest, map[string]any{"error": apiError{Type: "invalid_request_error", Code: "parameter_invalid_integer", Param: "amount_to_capture", Message: "Invalid positive integer"}}
		}
		amount = n
	}
	if amount > pi.AmountCapturable {
		return http.StatusBadRequest, map[string]any{"error": apiError{Type: "invalid_request_error", Code: "amount_too_large", Param: "amount_to_capture",
			Message: fmt.Sprintf("The amount_to_capture (%d) must be less than or equal to the amount_capturable (%d).", amount, pi.AmountCapturable)}}
	}
	// A new map: copies handed out earlier share the old one, and are
	// read without f.mu.
	metadata := maps.Clone(pi.Metadata)
	for k, v := range form {
		if name, ok := strings.CutPrefix(k, "metadata["); ok {
			metadata[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	pi.Metadata = metadata
	pi.Status, pi.AmountReceived, pi.AmountCapturable = "succeeded", amount, 0
	cp := *pi
	return http.StatusOK, &cp
}

// cancelLocked cancels pi. f.mu is held.
func (f *Fake) cancelLocked(pi *PaymentIntent, id, reason string, now time.Time) (int, any) {
	if pi == nil {
		return missingIntent(id)
	}
	f.settle(pi, now)
	if pi.Status == "succeeded" || pi.Status == "canceled" {
		return unexpectedState(pi, fmt.Sprintf("You cannot cancel this PaymentIntent because it has a status of %s. Only a PaymentIntent with one of the following statuses may be canceled: requires_payment_method, requires_capture, requires_confirmation, requires_action, processing.", pi.Status))
	}
	pi.Status, pi.AmountCapturable, pi.CancellationReason = "canceled", 0, reason
	cp := *pi
	return http.StatusOK, &cp
}

func first(form map[string][]string, k string) string {
	if v := form[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Expire cancels the PaymentIntent of an uncaptured authorization as Stripe
// does 7 days after its creation (the fake gives cancellation_reason
// automatic), for tests of a void that comes too late.
func (f *Fake) Expire(chargeRef string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, pi := range f.intents {
		if pi.Metadata["chargeonce_reference"] == chargeRef && pi.Status == "requires_capture" {
			pi.Status, pi.AmountCapturable, pi.CancellationReason = "canceled", 0, "automatic"
			return true
		}
	}
	return false
}

// ForgetKeys forgets every Idempotency-Key now, as Stripe does a day after
// their first use: a test decides when, instead of racing Options.KeyTTL.
func (f *Fake) ForgetKeys() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.keys)
}

// Captured returns how much the PaymentIntents of a chargeonce reference
// received, in Stripe's units: for an authorization, what its capture took.
func (f *Fake) Captured(chargeRef string) int64 {
	var n int64
	for _, pi := range f.Intents() {
		if pi.Metadata["chargeonce_reference"] == chargeRef && pi.Status == "succeeded" {
			n += pi.AmountReceived
		}
	}
	return n
}
