// Package stripetest is a small stateful fake of the Stripe PaymentIntents
// endpoints chargeonce's Stripe adapter uses: create (and confirm) with
// Idempotency-Key replay and expiry, search by metadata with a configurable
// lag, card errors, requires_action, and faults before and after the
// PaymentIntent is committed. Unlike stripe-mock, which checks the shape of
// requests, it remembers what it created, so tests can count PaymentIntents
// per reference: more than one succeeded for a reference is a double charge.
//
// # Payment methods
//
//	pm_card_visa (and any not listed)          succeeded
//	pm_card_visa_chargeDeclinedInsufficientFunds  card_error, decline_code insufficient_funds
//	pm_card_chargeDeclined                     card_error, decline_code generic_decline
//	pm_card_authenticationRequired             requires_action (3-D Secure)
//	pm_fail_before                             500, nothing created, key not kept
//	pm_fail_after                              created and succeeded, then 500 (the answer is lost);
//	                                           the key keeps the success, as Stripe's does
//	pm_drop_after                              created and succeeded, then the connection is cut
//	                                           without an answer (the key keeps the success)
//	pm_rate_limited                            429, nothing created (Retry-After: Options.RetryAfter)
//	pm_unavailable                             503, nothing created (Retry-After: Options.RetryAfter)
//	pm_slow                                    succeeded after Options.Slow; the key is in use meanwhile
//	                                           (a request with it answers 409 idempotency_key_in_use)
//	pm_invalid                                 400 invalid_request_error, nothing created
//	pm_processing                              processing (an asynchronous payment method) until
//	                                           Options.Processing after its creation, then succeeded;
//	                                           the key replays "processing", as Stripe's does
//
// A refund follows the payment method of the PaymentIntent it refunds:
// pm_fail_before, pm_fail_after and pm_drop_after strike the first request
// of each refund reference (metadata chargeonce_refund_reference) as they
// strike a create; pm_refund_pending captures, and its Refunds stay pending
// until Options.Processing after their creation (0: for ever).
//
// The faults strike only the first request for a reference (or every
// request within Options.FaultFor of its first), like a transient outage;
// later requests behave as pm_card_visa would. While a fault after the
// commit lasts, a replay of the key is lost too: the outage is between the
// caller and Stripe.
package stripetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The test payment methods; see the package documentation.
const (
	PMOK                  = "pm_card_visa"
	PMInsufficientFunds   = "pm_card_visa_chargeDeclinedInsufficientFunds"
	PMDeclined            = "pm_card_chargeDeclined"
	PMAuthRequired        = "pm_card_authenticationRequired"
	PMFailBefore          = "pm_fail_before"
	PMFailAfter           = "pm_fail_after"
	PMDropAfter           = "pm_drop_after"
	PMRateLimited         = "pm_rate_limited"
	PMUnavailable         = "pm_unavailable"
	PMSlow                = "pm_slow"
	PMInvalid             = "pm_invalid"
	PMProcessing          = "pm_processing"
	PMRefundPending       = "pm_refund_pending"
	DeclineInsufficient   = "insufficient_funds"
	DeclineGenericDecline = "generic_decline"
)

// Options configure a Fake. Zero durations mean: keys never expire, search
// sees everything at once.
type Options struct {
	// Key is the secret key requests must carry (Bearer); empty accepts any.
	Key string
	// KeyTTL is how long an Idempotency-Key is kept after its first use.
	KeyTTL time.Duration
	// SearchLag is how long a new PaymentIntent stays invisible to search.
	SearchLag time.Duration
	// FaultFor is how long after a reference's first request a fault
	// payment method keeps striking its requests (0: only the first
	// request). Longer than one call of the caller, with its own retries,
	// it makes the answer lost for good.
	FaultFor time.Duration
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up) with the 429 and 503 answers.
	RetryAfter time.Duration
	// Slow is how long pm_slow holds its request before it commits.
	Slow time.Duration
	// Processing is how long a pm_processing PaymentIntent stays
	// processing before it succeeds (0: for ever).
	Processing time.Duration
}

// PaymentIntent is the fake's record of one PaymentIntent.
type PaymentIntent struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Currency      string            `json:"currency"`
	Status        string            `json:"status"`
	PaymentMethod string            `json:"payment_method"`
	Metadata      map[string]string `json:"metadata"`
	Created       int64             `json:"created"`
	LastError     *apiError         `json:"last_payment_error"`
	// The fields of manual capture (capture.go).
	CaptureMethod      string `json:"capture_method"`
	AmountCapturable   int64  `json:"amount_capturable"`
	AmountReceived     int64  `json:"amount_received"`
	LatestCharge       string `json:"latest_charge,omitempty"`
	CancellationReason string `json:"cancellation_reason,omitempty"`
	createdAt          time.Time
}

type apiError struct {
	Type        string `json:"type"`
	Code        string `json:"code,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
	Message     string `json:"message"`
	Param       string `json:"param,omitempty"`
	// PaymentIntent is set on card errors, as Stripe does.
	PaymentIntent *PaymentIntent `json:"payment_intent,omitempty"`
}

type savedAnswer struct {
	params string
	status int
	body   []byte
	since  time.Time
}

// Request is one request the fake received, for tests that check what the
// adapter sent (its retries must keep the Idempotency-Key).
type Request struct {
	Method, Path, IdempotencyKey string
	Form                         url.Values
	// At is when it arrived.
	At time.Time
}

// Fake is the fake Stripe API; serve it with httptest.NewServer. It is safe
// for concurrent use.
type Fake struct {
	opts Options

	mu       sync.Mutex
	intents  []*PaymentIntent
	refunds  []*Refund
	keys     map[string]*savedAnswer
	inflight map[string]bool
	seen     map[string]time.Time // first create request per reference (faults strike it)
	opFaults map[string]string    // payment methods whose faults a capture or cancel key takes (capture.go)
	requests []Request
}

// New returns a Fake.
func New(opts Options) *Fake {
	return &Fake{opts: opts, keys: map[string]*savedAnswer{}, inflight: map[string]bool{}, seen: map[string]time.Time{}}
}

// ServeHTTP implements http.Handler.
func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.opts.Key != "" && r.Header.Get("Authorization") != "Bearer "+f.opts.Key {
		writeError(w, http.StatusUnauthorized, apiError{Type: "invalid_request_error", Message: "Invalid API Key provided"})
		return
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, apiError{Type: "invalid_request_error", Message: err.Error()})
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, Request{Method: r.Method, Path: r.URL.Path, IdempotencyKey: r.Header.Get("Idempotency-Key"), Form: r.Form, At: time.Now()})
	f.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/payment_intents":
		f.create(w, r)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/payment_intents/"):
		f.settleAuthorization(w, r, strings.TrimPrefix(r.URL.Path, "/v1/payment_intents/"))
	case r.Method == http.MethodGet && r.URL.Path == "/v1/payment_intents/search":
		f.search(w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/payment_intents/"):
		f.retrieve(w, strings.TrimPrefix(r.URL.Path, "/v1/payment_intents/"))
	case r.Method == http.MethodPost && r.URL.Path == "/v1/refunds":
		f.createRefund(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/refunds":
		f.listRefunds(w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/refunds/"):
		f.retrieveRefund(w, strings.TrimPrefix(r.URL.Path, "/v1/refunds/"))
	default:
		writeError(w, http.StatusNotFound, apiError{Type: "invalid_request_error", Message: "Unrecognized request URL"})
	}
}

func (f *Fake) create(w http.ResponseWriter, r *http.Request) {
	form := r.PostForm
	key := r.Header.Get("Idempotency-Key")
	params := form.Encode()
	now := time.Now()
	pm := form.Get("payment_method")
	ref := form.Get("metadata[chargeonce_reference]")

	f.mu.Lock()
	faulty := f.faultyLocked(ref, now)
	if key != "" {
		if f.keyAnsweredLocked(w, key, params, pm, faulty, now) {
			return
		}
		f.inflight[key] = true
		defer func() {
			f.mu.Lock()
			delete(f.inflight, key)
			f.mu.Unlock()
		}()
	}
	amount, _ := strconv.ParseInt(form.Get("amount"), 10, 64)
	if !faulty && (pm == PMFailBefore || pm == PMFailAfter || pm == PMDropAfter || pm == PMRateLimited || pm == PMUnavailable) {
		pm = PMOK
	}
	switch pm {
	case PMFailBefore:
		f.mu.Unlock()
		writeError(w, http.StatusInternalServerError, apiError{Type: "api_error", Message: "injected fault before commit"})
		return
	case PMRateLimited:
		f.mu.Unlock()
		f.retryAfter(w)
		writeError(w, http.StatusTooManyRequests, apiError{Type: "invalid_request_error", Code: "rate_limit", Message: "Too many requests"})
		return
	case PMUnavailable:
		f.mu.Unlock()
		f.retryAfter(w)
		writeError(w, http.StatusServiceUnavailable, apiError{Type: "api_error", Message: "injected outage before commit"})
		return
	case PMInvalid:
		f.mu.Unlock()
		writeError(w, http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "payment_method", Message: "No such PaymentMethod: 'pm_invalid'"})
		return
	case PMSlow:
		// The key stays in use while the request works; the caller may
		// give up (or die) meanwhile, and the PaymentIntent is still made.
		f.mu.Unlock()
		time.Sleep(f.opts.Slow)
		f.mu.Lock()
	}
	if amount <= 0 || form.Get("currency") == "" || form.Get("confirm") != "true" {
		f.mu.Unlock()
		writeError(w, http.StatusBadRequest, apiError{Type: "invalid_request_error", Code: "parameter_missing", Message: "amount, currency and confirm=true are required"})
		return
	}
	created := time.Now()
	pi := &PaymentIntent{
		ID:            fmt.Sprintf("pi_fake%06d", len(f.intents)+1),
		Object:        "payment_intent",
		Amount:        amount,
		Currency:      form.Get("currency"),
		PaymentMethod: pm,
		Metadata:      map[string]string{},
		Created:       created.Unix(),
		createdAt:     created,
	}
	for k, v := range form {
		if name, ok := strings.CutPrefix(k, "metadata["); ok {
			pi.Metadata[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	f.intents = append(f.intents, pi)
	status := http.StatusOK
	var answer any
	switch pm {
	case PMInsufficientFunds, PMDeclined:
		code := DeclineGenericDecline
		if pm == PMInsufficientFunds {
			code = DeclineInsufficient
		}
		pi.Status = "requires_payment_method"
		pi.LastError = &apiError{Type: "card_error", Code: "card_declined", DeclineCode: code, Message: "Your card was declined."}
		e := *pi.LastError
		cp := *pi
		e.PaymentIntent = &cp
		status, answer = http.StatusPaymentRequired, map[string]any{"error": e}
	case PMAuthRequired:
		pi.Status = "requires_action"
		answer = pi
	case PMProcessing:
		pi.Status = "processing"
		answer = pi
	default:
		pi.Status = "succeeded"
		answer = pi
	}
	authorizeOrCapture(pi, form.Get("capture_method"))
	body, _ := json.Marshal(answer)
	if key != "" {
		f.keys[key] = &savedAnswer{params: params, status: status, body: body, since: now}
	}
	f.mu.Unlock()
	if pm == PMFailAfter || pm == PMDropAfter {
		loseAnswer(w, pm)
		return
	}
	writeRaw(w, status, body)
}

// loseAnswer loses the answer of a committed request: a 500
// (pm_fail_after) or a connection cut without an answer (pm_drop_after).
func loseAnswer(w http.ResponseWriter, pm string) {
	if pm == PMFailAfter {
		writeError(w, http.StatusInternalServerError, apiError{Type: "api_error", Message: "injected fault after commit"})
		return
	}
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
		return
	}
	panic(http.ErrAbortHandler)
}

// retryAfter sets Retry-After from Options.RetryAfter, in whole seconds.
func (f *Fake) retryAfter(w http.ResponseWriter) {
	if d := f.opts.RetryAfter; d > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
	}
}

var queryRE = regexp.MustCompile(`^metadata\['([^']+)'\]:'((?:[^'\\]|\\.)*)'$`)

func (f *Fake) search(w http.ResponseWriter, r *http.Request) {
	m := queryRE.FindStringSubmatch(r.Form.Get("query"))
	if m == nil {
		writeError(w, http.StatusBadRequest, apiError{Type: "invalid_request_error", Param: "query", Message: "the fake understands only metadata['k']:'v'"})
		return
	}
	name, value := m[1], strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(m[2])
	now := time.Now()
	f.mu.Lock()
	data := []*PaymentIntent{}
	for _, pi := range f.intents {
		if pi.Metadata[name] == value && now.Sub(pi.createdAt) >= f.opts.SearchLag {
			f.settle(pi, now)
			cp := *pi
			data = append(data, &cp)
		}
	}
	f.mu.Unlock()
	body, _ := json.Marshal(map[string]any{"object": "search_result", "url": "/v1/payment_intents/search", "has_more": false, "data": data})
	writeRaw(w, http.StatusOK, body)
}

// retrieve answers GET /v1/payment_intents/{id}.
func (f *Fake) retrieve(w http.ResponseWriter, id string) {
	now := time.Now()
	f.mu.Lock()
	var found *PaymentIntent
	for _, pi := range f.intents {
		if pi.ID == id {
			f.settle(pi, now)
			cp := *pi
			found = &cp
		}
	}
	f.mu.Unlock()
	if found == nil {
		writeError(w, http.StatusNotFound, apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "intent",
			Message: fmt.Sprintf("No such payment_intent: '%s'", id)})
		return
	}
	body, _ := json.Marshal(found)
	writeRaw(w, http.StatusOK, body)
}

// settle moves a pm_processing PaymentIntent on once Options.Processing
// has passed. f.mu is held.
func (f *Fake) settle(pi *PaymentIntent, now time.Time) {
	if pi.Status == "processing" && f.opts.Processing > 0 && now.Sub(pi.createdAt) >= f.opts.Processing {
		pi.Status = "succeeded"
	}
}

// Intents returns every PaymentIntent created, oldest first.
func (f *Fake) Intents() []PaymentIntent {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]PaymentIntent, len(f.intents))
	now := time.Now()
	for i, pi := range f.intents {
		f.settle(pi, now)
		out[i] = *pi
	}
	return out
}

// Succeeded returns, per chargeonce reference, how many PaymentIntents
// succeeded: any count above one is a double charge.
func (f *Fake) Succeeded() map[string]int {
	out := map[string]int{}
	for _, pi := range f.Intents() {
		if pi.Status == "succeeded" {
			out[pi.Metadata["chargeonce_reference"]]++
		}
	}
	return out
}

// Duplicates returns the references with more than one PaymentIntent.
func (f *Fake) Duplicates() []string {
	per := map[string]int{}
	for _, pi := range f.Intents() {
		per[pi.Metadata["chargeonce_reference"]]++
	}
	var out []string
	for ref, n := range per {
		if n > 1 {
			out = append(out, ref)
		}
	}
	slices.Sort(out)
	return out
}

// Requests returns every request received, in order.
func (f *Fake) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

func writeError(w http.ResponseWriter, status int, e apiError) {
	if status == http.StatusConflict || status == http.StatusTooManyRequests {
		w.Header().Set("Stripe-Should-Retry", "false") // the test decides, not stripe-go
	}
	body, _ := json.Marshal(map[string]any{"error": e})
	writeRaw(w, status, body)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_fake")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
