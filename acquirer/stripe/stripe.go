// Package stripe is a chargeonce.Acquirer for Stripe PaymentIntents, through
// stripe-go.
//
// A capture creates and confirms a PaymentIntent in one request whose
// Idempotency-Key is the charge reference, with the reference, the order and
// the merchant in its metadata. Stripe keeps idempotency keys for about a
// day and its Search is eventually consistent, so a lookup answers honestly
// (see Acquirer.Lookup): a reference is called safe to send only when a
// re-send cannot create a second PaymentIntent.
//
// Manual capture (chargeonce.ManualCapturer, capture.go): an authorization
// is the same PaymentIntent created with capture_method manual, and its
// capture and its void are the PaymentIntent's capture and cancel, each
// with the operation's own reference as its Idempotency-Key. Their lookup
// reads the PaymentIntent, retrieved by id, which Stripe keeps consistent.
//
// This adapter does not run 3-D Secure customer authentication: a
// PaymentIntent that requires action is a decline with
// DeclineAuthenticationRequired.
package stripe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/chargeonce/chargeonce"
)

// Defaults of Options.
const (
	// DefaultKeyWindow is how long after a reference was first sent a
	// re-send with the same Idempotency-Key is taken to replay the first
	// answer. Stripe keeps keys for at least 24 hours; the hour less leaves
	// room for clocks that disagree and for the send it allows, which goes
	// on with stripe-go's retries for up to one acquirer timeout.
	DefaultKeyWindow = 23 * time.Hour
	// DefaultSearchLag is how long after its creation a PaymentIntent is
	// taken to be visible to Search: usually under a minute, up to an hour
	// during incidents (`--stripe-search-lag`).
	DefaultSearchLag = time.Hour
	// DefaultMaxNetworkRetries is how often stripe-go retries a request
	// itself. Every request the adapter makes is a GET or a POST carrying
	// the charge reference as its Idempotency-Key, so its retries are safe.
	DefaultMaxNetworkRetries = 2
	// MaxRetryAfter caps how long a Retry-After from Stripe holds a charge
	// back, so that a malformed or hostile header cannot park a charge for
	// days.
	MaxRetryAfter = time.Hour
)

// Metadata keys of the PaymentIntents the adapter creates.
const (
	MetaReference = "chargeonce_reference"
	MetaOrderID   = "order_id"
	MetaMerchant  = "merchant"
)

// Decline codes of outcomes Stripe gives no decline_code for.
const (
	// DeclineAuthenticationRequired: the PaymentIntent requires customer
	// action (3-D Secure), which this service does not run.
	DeclineAuthenticationRequired = "authentication_required"
	// DeclineCardError: a card error without a decline_code or code.
	DeclineCardError = "card_declined"
	// DeclineCanceled: the PaymentIntent was canceled.
	DeclineCanceled = "canceled"
)

// Options configure an Acquirer.
type Options struct {
	// Key is the secret API key. Required.
	Key string
	// APIBase replaces https://api.stripe.com (tests: stripe-mock, the
	// fake in stripetest).
	APIBase string
	// HTTPClient carries the requests; nil means a client without a
	// timeout of its own (each call is bounded by its context).
	HTTPClient *http.Client
	// KeyWindow is DefaultKeyWindow when zero.
	KeyWindow time.Duration
	// SearchLag is DefaultSearchLag when zero.
	SearchLag time.Duration
	// MaxNetworkRetries is DefaultMaxNetworkRetries when nil.
	MaxNetworkRetries *int64
	// Now is time.Now when nil (tests).
	Now func() time.Time
}

// Validate reports options that make no sense, naming the flag.
func (o Options) Validate() error {
	switch {
	case o.Key == "":
		return errors.New("--acquirer stripe needs a secret key: set STRIPE_SECRET_KEY or --stripe-key-file")
	case o.KeyWindow < 0:
		return fmt.Errorf("--stripe-key-window must not be negative; got %s", o.KeyWindow)
	case o.SearchLag < 0:
		return fmt.Errorf("--stripe-search-lag must not be negative; got %s", o.SearchLag)
	}
	return nil
}

// Acquirer captures charges as Stripe PaymentIntents.
type Acquirer struct {
	sc   *stripego.Client
	opts Options
	// known remembers the PaymentIntents of recent captures and
	// authorizations, by charge reference, for refunds, captures and voids.
	known intents
	// ops remembers the PaymentIntent each capture or void was sent to, by
	// the operation's reference, for its lookups.
	ops intents
}

var _ chargeonce.Acquirer = (*Acquirer)(nil)

// New returns an Acquirer, or the error of Options.Validate.
func New(opts Options) (*Acquirer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.KeyWindow == 0 {
		opts.KeyWindow = DefaultKeyWindow
	}
	if opts.SearchLag == 0 {
		opts.SearchLag = DefaultSearchLag
	}
	if opts.MaxNetworkRetries == nil {
		opts.MaxNetworkRetries = stripego.Int64(DefaultMaxNetworkRetries)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	cfg := &stripego.BackendConfig{
		HTTPClient:        opts.HTTPClient,
		MaxNetworkRetries: opts.MaxNetworkRetries,
		// stripe-go's own log lines would bypass ours; errors reach the
		// engine, which logs them.
		LeveledLogger: &stripego.LeveledLogger{Level: stripego.LevelNull},
	}
	if opts.APIBase != "" {
		cfg.URL = stripego.String(strings.TrimRight(opts.APIBase, "/"))
	}
	sc := stripego.NewClient(opts.Key, stripego.WithBackends(stripego.NewBackendsWithConfig(cfg)))
	return &Acquirer{sc: sc, opts: opts}, nil
}

// stripeGoTimeout and stripeGoMaxRetryDelay are stripe-go's own
// defaultHTTPTimeout and maxNetworkRetriesDelay: the longest one attempt
// of a request may take, and the longest pause before a retry.
const (
	stripeGoTimeoutS       = 80 // seconds
	stripeGoMaxRetryDelayS = 5  // seconds
)

var _ chargeonce.Finality = (*Acquirer)(nil)

// AcceptanceWindow implements chargeonce.Finality (SPEC "Finality"): how
// long after we last sent a request for a reference it may still reach
// Stripe. Our call is bounded by its context, but stripe-go sends it
// MaxNetworkRetries more times, each attempt allowed stripe-go's default
// timeout of 80 s, with up to 5 s between them; the window is that whole
// span, (1 + retries) × 80 s + retries × 5 s: 250 s with the default 2
// retries. Stripe cannot be fenced: a PaymentIntent's or Refund's
// creation cannot be refused in advance, so a "no" on a reference Stripe
// never saw waits out this window.
func (a *Acquirer) AcceptanceWindow() time.Duration {
	retries := max(*a.opts.MaxNetworkRetries, 0)
	return time.Duration((1+retries)*stripeGoTimeoutS+retries*stripeGoMaxRetryDelayS) * time.Second
}

// Amount maps an amount in the currency's ISO 4217 minor unit (a
// charge's amount_cents: whole yen, fils for KWD) to Stripe's amount for
// it. Stripe's amounts are minor units too, with exceptions Stripe keeps
// for compatibility (https://docs.stripe.com/currencies): ISK, zero-decimal
// in ISO 4217, is two-decimal at Stripe (×100); MGA, two-decimal in ISO
// 4217, is zero-decimal at Stripe (÷100, whole ariary only); and the
// three-decimal currencies (BHD, JOD, KWD, OMR, TND) must end in 0. An
// amount Stripe cannot take is an error, never rounded: rounding would
// charge a different amount than the merchant asked for.
func Amount(minor int64, currency string) (int64, error) {
	switch c := strings.ToUpper(currency); {
	case c == "ISK":
		if minor > math.MaxInt64/100 {
			return 0, fmt.Errorf("amount %d ISK is too large", minor)
		}
		return minor * 100, nil
	case c == "MGA":
		if minor%100 != 0 {
			return 0, fmt.Errorf("whole ariary only at Stripe: %s is not a multiple of 1 MGA", chargeonce.FormatAmount(minor, c))
		}
		return minor / 100, nil
	case chargeonce.CurrencyExponent(c) == 3 && minor%10 != 0:
		return 0, fmt.Errorf("three-decimal amounts must end in 0 at Stripe: %s does not (amount_cents %d)", chargeonce.FormatAmount(minor, c), minor)
	}
	return minor, nil
}

// Capture creates and confirms a PaymentIntent for req, with req.Reference
// as its Idempotency-Key. See the package documentation for the outcomes.
func (a *Acquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	return a.create(ctx, req, false)
}

// create creates and confirms the PaymentIntent of req: captured at once,
// or with manual only authorized (capture_method manual: it then waits in
// requires_capture for CaptureAuthorized or Void).
func (a *Acquirer) create(ctx context.Context, req chargeonce.CaptureRequest, manual bool) (chargeonce.CaptureResult, error) {
	amount, err := Amount(req.AmountCents, req.Currency)
	if err != nil {
		// Refused before Stripe is called: nothing was sent, nothing moved.
		return chargeonce.CaptureResult{}, fmt.Errorf("%w: %w", chargeonce.ErrCaptureRejected, err)
	}
	params := &stripego.PaymentIntentCreateParams{
		Amount:        stripego.Int64(amount),
		Currency:      stripego.String(strings.ToLower(req.Currency)),
		PaymentMethod: stripego.String(req.PaymentToken),
		Confirm:       stripego.Bool(true),
		// Confirmed at once, without a return_url: payment methods that
		// redirect the customer cannot complete here.
		AutomaticPaymentMethods: &stripego.PaymentIntentCreateAutomaticPaymentMethodsParams{
			Enabled:        stripego.Bool(true),
			AllowRedirects: stripego.String(string(stripego.PaymentIntentAutomaticPaymentMethodsAllowRedirectsNever)),
		},
	}
	if manual {
		params.CaptureMethod = stripego.String(string(stripego.PaymentIntentCaptureMethodManual))
	}
	params.SetIdempotencyKey(req.Reference)
	params.AddMetadata(MetaReference, req.Reference)
	params.AddMetadata(MetaOrderID, strconv.FormatInt(req.OrderID, 10))
	params.AddMetadata(MetaMerchant, req.Merchant)
	params.Context = ctx

	pi, err := a.sc.V1PaymentIntents.Create(ctx, params)
	if err != nil {
		res, cerr := captureError(req.Reference, err)
		return res, a.withRetryAfter(err, cerr)
	}
	res, settled := result(req.Reference, pi)
	if !settled {
		return chargeonce.CaptureResult{}, &OpenError{Reference: req.Reference, ID: pi.ID, Status: pi.Status}
	}
	if res.Status == chargeonce.StatusCaptured || res.Status == chargeonce.StatusAuthorized {
		a.known.put(req.Reference, pi.ID)
	}
	return res, nil
}

// OpenError is a capture whose PaymentIntent's outcome is still open
// (processing, for an asynchronous payment method). Its id is recorded
// (chargeonce.AcquirerIDError), so that recovery retrieves the
// PaymentIntent until it leaves that state: a re-send with the same
// Idempotency-Key would only replay the first answer, "processing", for as
// long as Stripe keeps the key.
type OpenError struct {
	Reference string
	ID        string
	Status    stripego.PaymentIntentStatus
}

// Error implements error.
func (e *OpenError) Error() string {
	return fmt.Sprintf("stripe: capturing %s: PaymentIntent %s is %s: the outcome is not known yet", e.Reference, e.ID, e.Status)
}

// AcquirerID implements chargeonce.AcquirerIDError.
func (e *OpenError) AcquirerID() string { return e.ID }

// captureError maps a failed create: a card error is a decline with
// Stripe's decline_code; a 4xx that describes the request is a definite
// refusal (chargeonce.ErrCaptureRejected); network errors, timeouts, 5xx,
// 429, 409 and idempotency errors are unknown outcomes.
func captureError(reference string, err error) (chargeonce.CaptureResult, error) {
	se, ok := errors.AsType[*stripego.Error](err)
	if !ok {
		return chargeonce.CaptureResult{}, fmt.Errorf("stripe: capturing %s: %w", reference, err)
	}
	summary := fmt.Sprintf("stripe: capturing %s: %d %s %s: %s (request %s)", reference, se.HTTPStatusCode, se.Type, se.Code, se.Msg, se.RequestID)
	switch {
	case se.Type == stripego.ErrorTypeCard:
		code := cmp.Or(string(se.DeclineCode), string(se.Code), DeclineCardError)
		return chargeonce.CaptureResult{Reference: reference, Status: chargeonce.StatusDeclined, DeclineCode: code}, nil
	case se.Type == stripego.ErrorTypeIdempotency:
		return chargeonce.CaptureResult{}, errors.New(summary)
	case rejected(se.HTTPStatusCode):
		return chargeonce.CaptureResult{}, fmt.Errorf("%w: %s", chargeonce.ErrCaptureRejected, summary)
	}
	return chargeonce.CaptureResult{}, errors.New(summary)
}

// RetryError is an unknown outcome, or a failed lookup, that Stripe
// answered 429 or 503 with a Retry-After header: the engine
// (engine.RetryAfterError) drives the charge again no sooner than that.
type RetryError struct {
	Err   error
	After time.Duration
}

// Error implements error.
func (e *RetryError) Error() string {
	return fmt.Sprintf("%v (Stripe asks to retry after %s)", e.Err, e.After)
}

// Unwrap returns the error Stripe's answer made.
func (e *RetryError) Unwrap() error { return e.Err }

// RetryAfter is how long Stripe asked to wait, at most MaxRetryAfter.
func (e *RetryError) RetryAfter() time.Duration { return e.After }

// withRetryAfter wraps err, the error a call returns, in a *RetryError when
// cause, what stripe-go returned, is a 429 or 503 answer carrying a
// Retry-After header (delay-seconds or an HTTP date); otherwise it returns
// err as it is.
func (a *Acquirer) withRetryAfter(cause, err error) error {
	if err == nil {
		return nil
	}
	se, ok := errors.AsType[*stripego.Error](cause)
	if !ok || se.LastResponse == nil || (se.HTTPStatusCode != http.StatusTooManyRequests && se.HTTPStatusCode != http.StatusServiceUnavailable) {
		return err
	}
	d, ok := parseRetryAfter(se.LastResponse.Header.Get("Retry-After"), a.opts.Now())
	if !ok {
		return err
	}
	return &RetryError{Err: err, After: min(d, MaxRetryAfter)}
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(MaxRetryAfter/time.Second))) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil || !at.After(now) {
		return 0, false
	}
	return at.Sub(now), true
}

// rejected reports whether a Stripe answer with status refuses the request
// itself. 401 and 403 describe our key, 404 a wrong API base, 408, 409, 425
// and 429 a transient state: fixed, the capture may go through, so those
// stay unknown outcomes as they do for the simulator's client.
func rejected(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusRequestTimeout,
		http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 400 && status < 500
}

// result maps a PaymentIntent to a settled result; settled is false while
// its outcome is still open (processing, or waiting for a confirmation the
// adapter never sends).
//
// A PaymentIntent with capture_method manual (Authorize's) answers what
// its authorization did, as the simulator does, whatever became of it
// since: authorized while it requires capture, and also once it succeeded
// (captured) or was canceled after it had been authorized (a charge and no
// payment error). What became of it is its capture's or void's to say
// (OperationLookup), and the engine settles an authorization's charge from
// authorized or declined only. Canceled without a successful
// authorization, it is a decline, as for any PaymentIntent.
func result(reference string, pi *stripego.PaymentIntent) (res chargeonce.CaptureResult, settled bool) {
	res = chargeonce.CaptureResult{Reference: reference, Status: chargeonce.StatusDeclined}
	manual := pi.CaptureMethod == stripego.PaymentIntentCaptureMethodManual
	switch pi.Status {
	case stripego.PaymentIntentStatusSucceeded:
		res.Status = chargeonce.StatusCaptured
		if manual {
			res.Status = chargeonce.StatusAuthorized
		}
	case stripego.PaymentIntentStatusRequiresCapture:
		if !manual {
			return chargeonce.CaptureResult{}, false
		}
		res.Status = chargeonce.StatusAuthorized
	case stripego.PaymentIntentStatusRequiresAction:
		res.DeclineCode = DeclineAuthenticationRequired
	case stripego.PaymentIntentStatusCanceled:
		if manual && pi.LatestCharge != nil && pi.LastPaymentError == nil {
			res.Status = chargeonce.StatusAuthorized
			break
		}
		res.DeclineCode = DeclineCanceled
	case stripego.PaymentIntentStatusRequiresPaymentMethod:
		// Confirmed and failed: its last error says why.
		res.DeclineCode = DeclineCardError
		if e := pi.LastPaymentError; e != nil {
			res.DeclineCode = cmp.Or(string(e.DeclineCode), string(e.Code), DeclineCardError)
		}
	default:
		return chargeonce.CaptureResult{}, false
	}
	return res, true
}

// Lookup implements chargeonce.Acquirer honestly.
//
// A reference whose PaymentIntent id is known (req.AcquirerID, or this
// adapter's own capture or authorization) is answered by retrieving that
// PaymentIntent: settled (an authorization is found authorized, captured
// or canceled), or unsure while it is open (processing), so recovery keeps
// retrieving it until it leaves that state.
//
// Otherwise, to decide a re-send (chargeonce.LookupToResend) while the
// reference is younger than KeyWindow, Stripe still holds its
// Idempotency-Key, so a re-send returns the first answer (or creates the
// only PaymentIntent): LookupSafeToSend, without a request. The age is
// req.Age, measured by the database's clock, never this instance's clock
// against a database timestamp.
//
// After that, and always to tell an operator what happened
// (chargeonce.LookupToResolve), it searches PaymentIntents by the reference
// in their metadata: a PaymentIntent found settles it (LookupFound), or
// leaves it LookupUnsure while its outcome is open. Search is eventually
// consistent, so a miss is LookupSafeToSend (nothing there) only for
// references older than SearchLag, else LookupUnsure.
func (a *Acquirer) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if req.AcquirerID == "" {
		// A PaymentIntent this adapter captured or authorized is retrieved:
		// unlike the window and the search, that read is consistent.
		req.AcquirerID = a.known.get(req.Reference)
	}
	if req.AcquirerID != "" {
		return a.retrieve(ctx, req)
	}
	if req.Purpose == chargeonce.LookupToResend && req.AgeKnown && req.Age < a.opts.KeyWindow {
		return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend,
			Reason: "within Stripe's idempotency-key window: a re-send with the same key replays the first answer"}, nil
	}
	params := &stripego.PaymentIntentSearchParams{}
	params.Query = fmt.Sprintf("metadata['%s']:'%s'", MetaReference, quote(req.Reference))
	params.Context = ctx
	var found []*stripego.PaymentIntent
	for pi, err := range a.sc.V1PaymentIntents.Search(ctx, params) {
		if err != nil {
			return chargeonce.LookupResult{}, a.withRetryAfter(err, fmt.Errorf("stripe: searching PaymentIntents of %s: %w", req.Reference, err))
		}
		if pi.Metadata[MetaReference] == req.Reference {
			found = append(found, pi)
		}
	}
	if len(found) > 0 {
		return pick(req.Reference, found), nil
	}
	if req.AgeKnown && req.Age >= a.opts.SearchLag {
		return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend,
			Reason: "no PaymentIntent found, and the reference is older than the search lag"}, nil
	}
	lr := chargeonce.LookupResult{Reason: "no PaymentIntent found yet, but Stripe's search may lag behind a recent one"}
	if req.AgeKnown {
		lr.RetryAfter = a.opts.SearchLag - req.Age
	}
	return lr, nil
}

// retrieve answers a lookup from the PaymentIntent whose id was recorded.
func (a *Acquirer) retrieve(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	params := &stripego.PaymentIntentRetrieveParams{}
	params.Context = ctx
	pi, err := a.sc.V1PaymentIntents.Retrieve(ctx, req.AcquirerID, params)
	if err != nil {
		return chargeonce.LookupResult{}, a.withRetryAfter(err, fmt.Errorf("stripe: retrieving PaymentIntent %s of %s: %w", req.AcquirerID, req.Reference, err))
	}
	if ref := pi.Metadata[MetaReference]; ref != req.Reference {
		return chargeonce.LookupResult{}, fmt.Errorf("stripe: PaymentIntent %s belongs to reference %q, not %s", pi.ID, ref, req.Reference)
	}
	return lookupOf(req.Reference, pi), nil
}

// lookupOf says what one PaymentIntent tells about its reference. Stripe's
// own state binds an operator where money moved or may still move: a
// PaymentIntent that succeeded, is processing or awaits capture can never
// be called declined, and one that requires action never captured.
func lookupOf(reference string, pi *stripego.PaymentIntent) chargeonce.LookupResult {
	res, settled := result(reference, pi)
	lr := chargeonce.LookupResult{AcquirerID: pi.ID, Reason: fmt.Sprintf("PaymentIntent %s is %s", pi.ID, pi.Status)}
	if settled {
		lr.Status, lr.Result = chargeonce.LookupFound, res
	}
	switch pi.Status {
	case stripego.PaymentIntentStatusSucceeded, stripego.PaymentIntentStatusRequiresAction,
		stripego.PaymentIntentStatusProcessing, stripego.PaymentIntentStatusRequiresCapture:
		// Processing (and an automatic PaymentIntent awaiting capture) is
		// unsure: lr.Open(). An authorization is found, authorized.
		lr.Binding = true
	}
	if settled && res.Status == chargeonce.StatusAuthorized {
		lr.Binding = true // an authorization: never declined, never captured by its charge
	}
	return lr
}

// pick settles a reference from its PaymentIntents: a succeeded one or an
// authorization wins (money moved, or is held), then one whose outcome is
// open (unsure), then a decline.
func pick(reference string, pis []*stripego.PaymentIntent) chargeonce.LookupResult {
	var open, declined []chargeonce.LookupResult
	for _, pi := range pis {
		lr := lookupOf(reference, pi)
		switch {
		case lr.Status == chargeonce.LookupFound && lr.Result.Status != chargeonce.StatusDeclined:
			return lr
		case lr.Status != chargeonce.LookupFound:
			open = append(open, lr)
		default:
			declined = append(declined, lr)
		}
	}
	if len(open) > 0 {
		return open[0]
	}
	return declined[0]
}

// quote escapes a value for a Stripe Search query string literal.
func quote(s string) string {
	return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s)
}
