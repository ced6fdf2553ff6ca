package acquirer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/chargeonce/chargeonce"
)

// The test tokens; see the package documentation. Any token not listed here
// behaves as TokenOK.
const (
	TokenOK         = "tok_ok"
	TokenDeclined   = "tok_declined"
	TokenSlow       = "tok_slow"
	TokenFailBefore = "tok_fail_before"
	TokenFailAfter  = "tok_fail_after"
)

// DeclineInsufficientFunds is the decline code of TokenDeclined.
const DeclineInsufficientFunds = "insufficient_funds"

// DefaultSlow is how long a TokenSlow capture takes when Options.Slow is
// zero (the default of `--slow`).
const DefaultSlow = 3 * time.Second

// Limits on the fields of a capture request. References travel in the
// Idempotency-Key header, so they obey the same rule as idempotency keys.
const (
	MaxReferenceLen    = 255
	MaxMerchantLen     = 255
	MaxPaymentTokenLen = 255
)

var (
	// ErrUnavailable is the error of a capture that answered 503: the
	// outcome is unknown to the caller (tok_fail_before captured nothing,
	// tok_fail_after captured and lost the reply). Client errors for a 503
	// answer match it too, through errors.Is.
	ErrUnavailable = errors.New("acquirer: service unavailable (503)")
	// ErrClosed is returned by Capture once the Simulator is closed.
	ErrClosed = errors.New("acquirer: simulator closed")
)

// Options configure a Simulator. The zero value is ready to use.
type Options struct {
	// Latency is added to every capture request (`--latency`), including
	// requests for a reference that has already settled. A request that
	// joins a capture under way waits for that capture instead.
	Latency time.Duration
	// Slow is how long a tok_slow capture takes on top of Latency
	// (`--slow`). Zero means DefaultSlow; to make tok_slow fast in tests,
	// use a small positive duration.
	Slow time.Duration
	// IdempotencyWindow (`--idempotency-window`) is how long the simulator
	// remembers a reference, as a real acquirer keeps idempotency keys for
	// a while only. A capture request for a reference more than
	// IdempotencyWindow after the first request of its window is treated as
	// new and moves money again (the window starts afresh with it); Get and
	// Lookup still find the first capture. Zero means forever.
	IdempotencyWindow time.Duration
	// AcceptanceWindow (`--acceptance-window`) is how long after it was
	// sent a request may still land (SPEC "Finality"): one that lands
	// later (a delay, a proxy that held it) is refused and moves nothing.
	// Zero means DefaultAcceptanceWindow.
	AcceptanceWindow time.Duration
}

// Validate reports options that make no sense, naming the flag, so that a
// command can refuse them at start.
func (o Options) Validate() error {
	if o.Latency < 0 {
		return fmt.Errorf("--latency must not be negative; got %s", o.Latency)
	}
	if o.Slow < 0 {
		return fmt.Errorf("--slow must not be negative; got %s", o.Slow)
	}
	if o.AcceptanceWindow < 0 {
		return fmt.Errorf("--acceptance-window must not be negative; got %s", o.AcceptanceWindow)
	}
	if o.IdempotencyWindow < 0 {
		return fmt.Errorf("--idempotency-window must not be negative; got %s", o.IdempotencyWindow)
	}
	return nil
}

// Capture is the acquirer's record of one reference that settled: captured
// (money moved) or declined.
type Capture struct {
	Reference   string            `json:"reference"`
	OrderID     int64             `json:"order_id"`
	Merchant    string            `json:"merchant"`
	AmountCents int64             `json:"amount_cents"`
	Currency    string            `json:"currency"`
	Status      chargeonce.Status `json:"status"`
	// DeclineCode is empty when the capture succeeded; it is encoded as
	// JSON null then, as chargeonce's charge object does.
	DeclineCode string    `json:"decline_code"`
	CreatedAt   time.Time `json:"created_at"`
}

// MarshalJSON encodes c with decline_code null when it is empty.
func (c Capture) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Reference   string            `json:"reference"`
		OrderID     int64             `json:"order_id"`
		Merchant    string            `json:"merchant"`
		AmountCents int64             `json:"amount_cents"`
		Currency    string            `json:"currency"`
		Status      chargeonce.Status `json:"status"`
		DeclineCode *string           `json:"decline_code"`
		CreatedAt   time.Time         `json:"created_at"`
	}{c.Reference, c.OrderID, c.Merchant, c.AmountCents, c.Currency, c.Status, nullable(c.DeclineCode), c.CreatedAt})
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Result returns the answer a capture request for c's reference gets.
func (c Capture) Result() chargeonce.CaptureResult {
	return chargeonce.CaptureResult{Reference: c.Reference, Status: c.Status, DeclineCode: c.DeclineCode}
}

// Stats count what a Simulator did since it was created.
type Stats struct {
	// CaptureRequests counts every valid capture request received.
	CaptureRequests int64 `json:"capture_requests"`
	// Captures counts captures that moved money: one per reference, or
	// more when a reference was sent again after the idempotency window.
	// Declines are not captures.
	Captures int64 `json:"captures"`
	// DuplicateRequests counts requests for a reference whose capture had
	// already settled or was under way; they moved no money. A retry after
	// tok_fail_before is not a duplicate: nothing had been captured, and
	// that retry is the one that captures.
	DuplicateRequests int64 `json:"duplicate_requests"`
	// RefundRequests counts every valid refund request; Refunds the
	// refunds that moved money back (one per refund reference at most);
	// DuplicateRefundRequests the requests for a refund reference that
	// had already settled, which moved nothing.
	RefundRequests          int64 `json:"refund_requests"`
	Refunds                 int64 `json:"refunds"`
	DuplicateRefundRequests int64 `json:"duplicate_refund_requests"`
	// Authorizations counts authorizations that held money (Authorize);
	// OperationRequests every valid capture or void request of an
	// authorization; AuthorizationCaptures and Voids those that settled
	// it (one per authorization at most); DuplicateOperationRequests the
	// requests for an operation reference that had already settled.
	Authorizations             int64 `json:"authorizations"`
	OperationRequests          int64 `json:"operation_requests"`
	AuthorizationCaptures      int64 `json:"authorization_captures"`
	Voids                      int64 `json:"voids"`
	DuplicateOperationRequests int64 `json:"duplicate_operation_requests"`
	// LateRequests counts requests refused because they landed past the
	// acceptance window or under a fenced reference; Fences the
	// references fenced (SPEC "Finality").
	LateRequests int64 `json:"late_requests"`
	Fences       int64 `json:"fences"`
}

// Simulator is an in-memory acquirer, idempotent by reference. It implements
// chargeonce.Acquirer directly, so `serve --acquirer sim` calls it in-process;
// Handler serves it over HTTP. It is safe for concurrent use. Close it to
// wait for the captures still running.
type Simulator struct {
	opts Options

	mu      sync.Mutex
	refs    map[string]*reference
	byOrder map[orderKey][]*Capture // settled captures, in settling order
	refunds map[string]*refundRef   // by the refund's reference
	ops     map[string]*opRef       // captures and voids of authorizations, by their reference
	stats   Stats
	closed  bool
	ledger  ledger // every settled capture, authorization, void and refund, for reconciliation (ledger.go)

	closing chan struct{} // closed by Close: captures skip their remaining delay
	wg      sync.WaitGroup
}

var _ chargeonce.Acquirer = (*Simulator)(nil)

type orderKey struct {
	merchant string
	orderID  int64
}

// reference is the simulator's state for one reference. Exactly one of
// these holds: capture != nil (settled in the current idempotency window),
// run != nil (a capture under way), or neither (the first request failed
// before capturing, or the window ended; the next request starts afresh).
type reference struct {
	capture *Capture
	run     *run
	runs    int // captures started for this reference
	// first is the reference's first settled capture, which Get and Lookup
	// return even after the window has ended and the reference captured
	// again.
	first *Capture
	// since is when the current idempotency window began: the first
	// request for the reference, or the first after the last window ended.
	since time.Time
	// token is the payment token of the reference's first request: its
	// refunds behave as it says (the same fault tokens).
	token string
	// refunded is the sum of the capture's refunds that succeeded.
	refunded int64
	// settledBy is the reference of the capture or void that settled an
	// authorization (first.Status authorized), and captured what its
	// capture took (zero after a void).
	settledBy string
	captured  int64
	voided    bool
	// fenced: Fence was called before anything landed; every later
	// request for the reference is refused.
	fenced bool
}

// capturedCents is what the reference's first capture took: its amount
// when it captured, what a capture of its authorization took, else zero.
func (ref *reference) capturedCents() int64 {
	switch {
	case ref.first == nil:
		return 0
	case ref.first.Status == chargeonce.StatusCaptured:
		return ref.first.AmountCents
	case ref.first.Status == chargeonce.StatusAuthorized:
		return ref.captured
	}
	return 0
}

// run is one capture under way, executed on its own goroutine.
type run struct {
	req   chargeonce.CaptureRequest
	token string // effective token: faults are stripped after the first run
	done  chan struct{}

	// Set before done is closed.
	result      chargeonce.CaptureResult // what waiters get
	starterErr  error                    // what the request that started the run gets instead, if not nil
	failsBefore bool                     // the run captures nothing; waiters start afresh
	manual      bool                     // an authorization: success is authorized, nothing captured yet
}

// NewSimulator returns a Simulator. Negative durations in opts are treated
// as zero (see Options.Validate); a zero Slow is DefaultSlow.
func NewSimulator(opts Options) *Simulator {
	opts.Latency = max(opts.Latency, 0)
	if opts.Slow <= 0 {
		opts.Slow = DefaultSlow
	}
	return &Simulator{
		opts:    opts,
		refs:    make(map[string]*reference),
		byOrder: make(map[orderKey][]*Capture),
		refunds: make(map[string]*refundRef),
		ops:     make(map[string]*opRef),
		closing: make(chan struct{}),
	}
}

// Capture captures req, idempotently by req.Reference; see the package
// documentation for the test tokens. A nil error is a definite answer
// (captured or declined). ErrUnavailable means the outcome is unknown to the
// caller; ctx.Err() means the caller stopped waiting while the capture, if
// this request started one, carries on. An invalid request is a
// chargeonce.EINVALID error naming the field, and is not counted.
func (s *Simulator) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	return s.capture(ctx, req, false)
}

// capture is Capture, or Authorize when manual: the same run, whose success
// is captured or, for an authorization, authorized.
func (s *Simulator) capture(ctx context.Context, req chargeonce.CaptureRequest, manual bool) (chargeonce.CaptureResult, error) {
	if err := ValidateCaptureRequest(req); err != nil {
		return chargeonce.CaptureResult{}, err
	}
	if err := ctx.Err(); err != nil {
		// The request was never sent.
		return chargeonce.CaptureResult{}, err
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return chargeonce.CaptureResult{}, ErrClosed
	}
	s.stats.CaptureRequests++
	for {
		ref := s.refs[req.Reference]
		if w := s.opts.IdempotencyWindow; w > 0 && ref != nil && ref.run == nil && time.Since(ref.since) > w {
			// The acquirer has forgotten the reference: this request is a
			// new one, and moves money again if it captures.
			ref.capture = nil
			ref.since = time.Now()
		}
		switch {
		case ref != nil && ref.capture != nil:
			// Settled: the stored result, no money moves.
			s.stats.DuplicateRequests++
			res := ref.capture.Result()
			s.mu.Unlock()
			if err := s.pause(ctx, s.opts.Latency); err != nil {
				return chargeonce.CaptureResult{}, err
			}
			return res, nil

		case ref != nil && ref.run != nil:
			// Under way: wait for it and take its result.
			r := ref.run
			if !r.failsBefore {
				s.stats.DuplicateRequests++
			}
			s.mu.Unlock()
			select {
			case <-r.done:
			case <-ctx.Done():
				return chargeonce.CaptureResult{}, ctx.Err()
			}
			if !r.failsBefore {
				return r.result, nil
			}
			// The fault struck the first request only; this one behaves
			// as tok_ok and starts (or joins) a capture of its own.
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				return chargeonce.CaptureResult{}, ErrClosed
			}
			continue
		}

		// Nothing captured yet: this request starts the capture, unless
		// the reference is fenced.
		if ref != nil && ref.fenced {
			err := s.refuseLate(req.Reference, true, time.Now())
			s.mu.Unlock()
			return chargeonce.CaptureResult{}, err
		}
		if ref == nil {
			ref = &reference{since: time.Now(), token: req.PaymentToken}
			s.refs[req.Reference] = ref
		}
		r := s.start(ref, req, manual)
		s.mu.Unlock()
		select {
		case <-r.done:
		case <-ctx.Done():
			return chargeonce.CaptureResult{}, ctx.Err()
		}
		if r.starterErr != nil {
			return chargeonce.CaptureResult{}, r.starterErr
		}
		return r.result, nil
	}
}

// start begins a capture of ref on its own goroutine. s.mu must be held.
func (s *Simulator) start(ref *reference, req chargeonce.CaptureRequest, manual bool) *run {
	ref.runs++
	token := req.PaymentToken
	if ref.runs > 1 && (token == TokenFailBefore || token == TokenFailAfter) {
		token = TokenOK
	}
	r := &run{req: req, token: token, done: make(chan struct{}), failsBefore: token == TokenFailBefore, manual: manual}
	ref.run = r
	// Added under s.mu while not closed, so it happens before Close's Wait.
	s.wg.Go(func() { s.execute(ref, r) })
	return r
}

// execute performs r: it waits out the capture's delay, independent of any
// caller, and settles the reference.
func (s *Simulator) execute(ref *reference, r *run) {
	delay := s.opts.Latency
	if r.token == TokenSlow {
		delay += s.opts.Slow
	}
	s.wait(delay)

	s.mu.Lock()
	defer s.mu.Unlock()
	defer close(r.done)
	ref.run = nil
	switch r.token {
	case TokenFailBefore:
		r.starterErr = fmt.Errorf("%w: %s: nothing captured for reference %s", ErrUnavailable, TokenFailBefore, r.req.Reference)
		return
	case TokenFailAfter:
		r.starterErr = fmt.Errorf("%w: %s: reference %s captured, reply lost", ErrUnavailable, TokenFailAfter, r.req.Reference)
	}
	c := &Capture{
		Reference:   r.req.Reference,
		OrderID:     r.req.OrderID,
		Merchant:    r.req.Merchant,
		AmountCents: r.req.AmountCents,
		Currency:    r.req.Currency,
		Status:      chargeonce.StatusCaptured,
		CreatedAt:   time.Now().UTC(),
	}
	switch {
	case r.token == TokenDeclined:
		c.Status = chargeonce.StatusDeclined
		c.DeclineCode = DeclineInsufficientFunds
	case r.manual:
		// Held, not taken: the capture or void comes later (capture.go),
		// and only then does money move. The ledger lists the
		// authorization as one, which moves nothing.
		c.Status = chargeonce.StatusAuthorized
		s.stats.Authorizations++
	default:
		s.stats.Captures++
	}
	ref.capture = c
	if ref.first == nil {
		ref.first = c
	}
	k := orderKey{c.Merchant, c.OrderID}
	s.byOrder[k] = append(s.byOrder[k], c)
	s.ledger.addCapture(c)
	r.result = c.Result()
}

// wait sleeps for d, whoever waits for the request; Close cuts it short:
// the simulator finishes at once the requests it accepted.
func (s *Simulator) wait(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.closing:
	}
}

// pause sleeps for d unless ctx ends first; Close cuts it short.
func (s *Simulator) pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-s.closing:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Get returns the first settled capture for reference. It reports false when
// the reference never reached the simulator, when its first capture is still
// under way, and after a tok_fail_before request that captured nothing.
func (s *Simulator) Get(reference string) (Capture, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref := s.refs[reference]
	if ref == nil || ref.first == nil {
		return Capture{}, false
	}
	return *ref.first, true
}

// ErrInProgress is the error of a Lookup for a reference whose first
// capture was still under way when the caller stopped waiting: the outcome
// is not known yet.
var ErrInProgress = errors.New("acquirer: the capture is still under way")

// Lookup implements chargeonce.Acquirer. The simulator never loses track of
// a reference, so it always knows: LookupFound with the first settled
// capture, or LookupSafeToSend when no capture exists under the reference
// (it never reached the simulator, or its requests failed before
// capturing). While the reference's first capture is under way it waits for
// it, as a repeated capture request does; if ctx ends first the error
// matches ErrInProgress. It moves no money and is not counted in Stats.
func (s *Simulator) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if err := ctx.Err(); err != nil {
		return chargeonce.LookupResult{}, err
	}
	s.mu.Lock()
	for {
		ref := s.refs[req.Reference]
		switch {
		case ref == nil:
			s.mu.Unlock()
			return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "the acquirer never saw the reference"}, nil
		case ref.first != nil:
			res := ref.first.Result()
			s.mu.Unlock()
			return chargeonce.LookupResult{Status: chargeonce.LookupFound, Result: res}, nil
		case ref.run == nil:
			s.mu.Unlock()
			return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "the reference's requests captured nothing"}, nil
		}
		done := ref.run.done
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return chargeonce.LookupResult{}, fmt.Errorf("%w: reference %s: %w", ErrInProgress, req.Reference, ctx.Err())
		}
		s.mu.Lock()
	}
}

// ListByOrder returns every settled capture (captured or declined) of the
// merchant's order, oldest first. It never returns nil.
func (s *Simulator) ListByOrder(orderID int64, merchant string) []Capture {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.byOrder[orderKey{merchant, orderID}]
	out := make([]Capture, len(list))
	for i, c := range list {
		out[i] = *c
	}
	return out
}

// CapturedCount returns how many distinct references captured money for the
// merchant's order. A test asserts "charged once" with CapturedCount == 1:
// anything above one is a double charge.
func (s *Simulator) CapturedCount(merchant string, orderID int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.byOrder[orderKey{merchant, orderID}] {
		if c.Status == chargeonce.StatusCaptured {
			n++
		}
	}
	return n
}

// Captures returns every settled capture of every merchant, ordered by
// merchant, order and time, for tests that look for doubles across orders.
func (s *Simulator) Captures() []Capture {
	s.mu.Lock()
	var out []Capture
	for _, list := range s.byOrder {
		for _, c := range list {
			out = append(out, *c)
		}
	}
	s.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Capture) int {
		return cmp.Or(
			cmp.Compare(a.Merchant, b.Merchant),
			cmp.Compare(a.OrderID, b.OrderID),
			a.CreatedAt.Compare(b.CreatedAt),
			cmp.Compare(a.Reference, b.Reference),
		)
	})
	return out
}

// Stats returns the simulator's counters.
func (s *Simulator) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Wait blocks until no capture is under way, including captures whose
// callers gave up. Tests use it before asserting on what settled.
func (s *Simulator) Wait() {
	for {
		s.mu.Lock()
		var pending []chan struct{}
		for _, ref := range s.refs {
			if ref.run != nil {
				pending = append(pending, ref.run.done)
			}
		}
		s.mu.Unlock()
		if len(pending) == 0 {
			return
		}
		for _, done := range pending {
			<-done
		}
	}
}

// Close stops the simulator: captures under way skip the rest of their
// delay and settle at once (the acquirer finishes work it accepted), Close
// waits for them, and later Capture calls return ErrClosed. Reads (Get,
// Stats, ...) keep working. Close is safe to call more than once.
func (s *Simulator) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.closing)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// ValidateCaptureRequest checks req's fields. Errors are chargeonce.EINVALID,
// name the offending field, and match chargeonce.ErrCaptureRejected: the
// acquirer refuses the request and moves no money.
func ValidateCaptureRequest(req chargeonce.CaptureRequest) error {
	if err := validateCaptureRequest(req); err != nil {
		return fmt.Errorf("%w: %w", chargeonce.ErrCaptureRejected, err)
	}
	return nil
}

func validateCaptureRequest(req chargeonce.CaptureRequest) error {
	if !visibleASCII(req.Reference, MaxReferenceLen) {
		return chargeonce.FieldError("reference", "reference must be 1 to %d visible ASCII characters", MaxReferenceLen)
	}
	if req.OrderID <= 0 {
		return chargeonce.FieldError("order_id", "order_id must be a positive 64-bit integer")
	}
	if req.Merchant == "" || len(req.Merchant) > MaxMerchantLen {
		return chargeonce.FieldError("merchant", "merchant must be 1 to %d bytes", MaxMerchantLen)
	}
	if req.AmountCents <= 0 {
		return chargeonce.FieldError("amount_cents", "amount_cents must be a positive 64-bit integer")
	}
	if !upperCode(req.Currency) {
		return chargeonce.FieldError("currency", "currency must be an upper-case ISO 4217 code such as BRL; got %q", req.Currency)
	}
	if !visibleASCII(req.PaymentToken, MaxPaymentTokenLen) {
		return chargeonce.FieldError("payment_token", "payment_token must be 1 to %d visible ASCII characters", MaxPaymentTokenLen)
	}
	return nil
}

func visibleASCII(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

func upperCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}
