// Package client is a Go client for the chargeonce HTTP API that retries the
// right way.
//
// Half of idempotency lives in the client. A client that times out cannot
// know whether its charge happened, so it must retry; the service can only
// recognise the retry if it carries the same Idempotency-Key as the first
// attempt. So the key belongs to the payment intent, not to the HTTP
// request: CreateCharge makes one random key per call (or takes the one in
// ChargeRequest.IdempotencyKey) and sends it, with the very same body bytes,
// on every attempt. A client that made a fresh key per attempt would turn
// every timeout into a possible second charge.
//
// # Retry policy
//
//	answer                                   retried?
//	connection error, per-attempt timeout    yes: the service may have done the work; the retry replays it
//	202 processing                           yes, until a final answer, after Retry-After: the record is backed off, and a retry after that may re-drive it by the same reference
//	409 request-in-progress                  yes, after Retry-After (another attempt holds the key)
//	408, 429, 5xx                            yes, after Retry-After when sent: the same key makes a retry safe whatever happened
//	400, 413 validation                      no: ValidationError
//	401                                      no: UnauthorizedError
//	402 card-declined                        no: DeclinedError (the decline is stored; a retry would only replay it)
//	422 idempotency-key-reused               no: KeyReusedError
//	other 4xx (404 ...)                      no: APIError
//
// A 5xx never means that nothing was charged: the service's database may
// have committed the intent while its acknowledgement was lost (503
// unavailable). Only a retry with the same key can tell, so every 5xx is
// retried with it; a caller that gives up must keep the key (see below).
//
// Waits between attempts use exponential backoff with full jitter
// (a uniform random wait in [0, min(max, base·2ⁿ⁻¹)]) so that clients that
// failed together do not retry together; a Retry-After from the service is
// a floor under that wait. A retry horizon (WithRetryFor, DefaultRetryFor:
// one minute), the context's deadline and, when set, WithMaxAttempts bound
// the whole call: when the next attempt could only start after the horizon
// or the deadline, the call gives up at once rather than sleep into a
// certain failure.
//
// The default horizon outlasts the service's defaults: when the instance
// that held an intent crashes, the retries answer 409 until that attempt's
// lease (30s) ends, and then one of them finishes the charge, which can
// take the acquirer timeout (2s) more. A client that gave up sooner would
// leave every caller of a crashed instance without an answer.
//
// # Giving up, and resuming
//
// When no final answer came in time the call returns a *GaveUpError: the
// outcome is unknown (the charge may have been made). Its Key is the
// intent's idempotency key, also when CreateCharge made it: keep it, and
// call CreateCharge again later with ChargeRequest.IdempotencyKey set to it
// (and the same request) to learn the outcome. A new key is a new payment.
//
// # Replays
//
// A successful answer may be a replay: the stored response of an earlier
// attempt (Charge.Replayed, from the Idempotent-Replayed: true header).
// The flag says when the service decided, not whether this caller already
// knows: when the first attempt of a call succeeded but its answer was lost
// (a timeout, a dropped connection), the retry gets a replay, and that
// replay is the only success the caller ever sees. So Replayed is no reason
// to withhold an order. Fulfil once per intent, keyed by the intent (the
// order, or the idempotency key stored with it), whatever the flag says:
// fulfilment must itself be idempotent, because the same intent can also
// succeed in two calls (a process that crashed after the charge and
// resumed with the same key).
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults of the options.
const (
	// DefaultRetryFor bounds how long one call keeps trying. It is longer
	// than the service's default lease (30s) plus its acquirer timeout
	// (2s): a call whose attempt was held by an instance that crashed keeps
	// retrying until the lease ends and a retry finishes the charge, with
	// room to spare for a database failover.
	DefaultRetryFor = 60 * time.Second
	// DefaultMaxAttempts is 0: the number of attempts is not bounded by
	// default, DefaultRetryFor is. A count is a poor bound: how long it
	// lasts depends on the backoff and on every Retry-After.
	DefaultMaxAttempts = 0
	// DefaultAttemptTimeout bounds one attempt. The service answers within
	// its acquirer timeout (2s by default) plus a few database writes; an
	// attempt that takes much longer is stuck on the network, and a retry on
	// a fresh connection finds the answer sooner.
	DefaultAttemptTimeout = 10 * time.Second
	// DefaultBackoffBase and DefaultBackoffMax shape the waits between
	// attempts (see the package documentation).
	DefaultBackoffBase = 200 * time.Millisecond
	DefaultBackoffMax  = 5 * time.Second
)

// maxResponseBytes bounds the answer read from the service; its answers are
// a few hundred bytes, a list a few hundred per charge.
const maxResponseBytes = 8 << 20

// userAgent identifies this client in the service's logs.
const userAgent = "chargeonce-go-client/1"

// Client talks to one chargeonce service as one merchant. It is safe for
// concurrent use; make one and share it.
type Client struct {
	base           string
	configErr      error // a bad base URL or API key, reported by every call
	apiKey         string
	hc             *http.Client
	maxAttempts    int // 0: no bound
	retryFor       time.Duration
	attemptTimeout time.Duration
	backoffBase    time.Duration
	backoffMax     time.Duration
	hook           func(Attempt)
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send its requests through hc. The default
// is a client of its own that does not follow redirects: a redirected POST
// may silently become a GET, and a payment API has no reason to redirect.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithMaxAttempts bounds the HTTP requests of one call, the first included.
// Zero or less means no bound (the default, DefaultMaxAttempts): the retry
// horizon (WithRetryFor) and the context bound the call. 1 means no retries.
func WithMaxAttempts(n int) Option {
	return func(c *Client) { c.maxAttempts = max(n, 0) }
}

// WithRetryFor sets how long one call keeps trying (default
// DefaultRetryFor): no attempt starts later than d after the call began.
// Zero or less leaves the call bounded only by the context and
// WithMaxAttempts. Keep it longer than the service's lease plus its
// acquirer timeout, or a caller whose attempt was held by a crashed
// instance gives up before the charge can be finished.
func WithRetryFor(d time.Duration) Option {
	return func(c *Client) { c.retryFor = max(d, 0) }
}

// WithAttemptTimeout bounds each attempt (default DefaultAttemptTimeout);
// an attempt that runs out is retried. Zero or less leaves attempts bounded
// only by the context.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *Client) { c.attemptTimeout = max(d, 0) }
}

// WithBackoff sets the base and the cap of the exponential backoff between
// attempts (defaults DefaultBackoffBase, DefaultBackoffMax). A base of zero
// or less keeps the default; a cap below the base is the base.
func WithBackoff(base, maxWait time.Duration) Option {
	return func(c *Client) {
		if base > 0 {
			c.backoffBase = base
		}
		c.backoffMax = max(maxWait, c.backoffBase)
	}
}

// Attempt describes one finished HTTP request of a call, for logging.
type Attempt struct {
	// N counts the call's attempts from 1.
	N            int
	Method, Path string
	// Key is the idempotency key (CreateCharge only).
	Key string
	// Status is the HTTP status, 0 when there was no answer (Err says why).
	Status   int
	Replayed bool
	Err      error
	Duration time.Duration
	// Wait is how long the client waits before the next attempt; zero
	// when this attempt was the last.
	Wait time.Duration
}

// WithAttemptHook calls hook after every attempt, on the calling goroutine.
// `chargeonce charge` uses it to print the attempts.
func WithAttemptHook(hook func(Attempt)) Option {
	return func(c *Client) { c.hook = hook }
}

// New returns a Client for the service at baseURL (for example
// http://127.0.0.1:8080) with the merchant's API key. A malformed baseURL or
// API key is reported by every call, before any request is sent.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		base:           strings.TrimRight(baseURL, "/"),
		apiKey:         apiKey,
		maxAttempts:    DefaultMaxAttempts,
		retryFor:       DefaultRetryFor,
		attemptTimeout: DefaultAttemptTimeout,
		backoffBase:    DefaultBackoffBase,
		backoffMax:     DefaultBackoffMax,
	}
	if u, err := url.Parse(c.base); err != nil {
		c.configErr = fmt.Errorf("chargeonce: invalid base URL %q: %w", baseURL, err)
	} else if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		c.configErr = fmt.Errorf("chargeonce: invalid base URL %q: want http(s)://host[:port]", baseURL)
	}
	if strings.ContainsFunc(apiKey, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		// net/http would refuse to send it, which would look like a
		// connection error and be retried for nothing.
		c.configErr = errors.New("chargeonce: the API key may hold only visible ASCII characters")
	}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{
			Transport:     http.DefaultTransport.(*http.Transport).Clone(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return c
}

// CloseIdleConnections closes the idle keep-alive connections of the
// client's HTTP client.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// CreateCharge charges once for the intent req describes, retrying as the
// package documentation says until it has a final answer.
//
// It returns the captured charge, or an error: *DeclinedError,
// *KeyReusedError, *ValidationError, *UnauthorizedError, *APIError, or
// *GaveUpError when no final answer came in time, in which case the outcome
// is unknown and calling again with the error's Key as IdempotencyKey
// learns it. Attempts(err) says how many requests were made.
//
// A captured charge means the intent is paid, whether or not Replayed is
// set: fulfil it once per intent (see the package documentation).
func (c *Client) CreateCharge(ctx context.Context, req ChargeRequest) (*Charge, error) {
	ex, n, err := c.post(ctx, "/v1/charges", req.IdempotencyKey, req)
	if err != nil {
		return nil, err
	}
	return decodeCharge(ex, n)
}

// post runs a money operation (a charge, a refund) with the charge
// protocol's retry rules: one idempotency key (key, or a random one) and
// one encoded body for every attempt, until a final answer; an answer other
// than 200 or 201 is the error it says.
func (c *Client) post(ctx context.Context, path, key string, req any) (*exchange, int, error) {
	if key == "" {
		key = NewIdempotencyKey()
	} else if err := checkKey(key); err != nil {
		return nil, 0, localValidationError("invalid-idempotency-key", "Invalid Idempotency-Key", err.Error())
	}
	// The body is encoded once: every attempt sends these very bytes.
	body, err := json.Marshal(req)
	if err != nil {
		return nil, 0, fmt.Errorf("chargeonce: encoding the request to %s: %w", path, err)
	}
	ex, n, err := c.run(ctx, call{method: http.MethodPost, path: path, body: body, key: key})
	if err != nil {
		return nil, n, err
	}
	if ex.status != http.StatusCreated && ex.status != http.StatusOK {
		return nil, n, responseError(ex, n)
	}
	return ex, n, nil
}

// GetCharge returns the charge's current state. A charge that does not
// exist, or belongs to another merchant, is an *APIError with slug
// "not-found".
func (c *Client) GetCharge(ctx context.Context, id string) (*Charge, error) {
	ex, n, err := c.run(ctx, call{method: http.MethodGet, path: "/v1/charges/" + url.PathEscape(id)})
	if err != nil {
		return nil, err
	}
	if ex.status != http.StatusOK {
		return nil, responseError(ex, n)
	}
	return decodeCharge(ex, n)
}

func decodeCharge(ex *exchange, n int) (*Charge, error) {
	var ch Charge
	if err := json.Unmarshal(ex.body, &ch); err != nil {
		return nil, &finalError{fmt.Errorf("chargeonce: decoding the charge in a %d answer: %w", ex.status, err), n}
	}
	ch.Replayed = ex.replayed
	ch.Attempts = n
	return &ch, nil
}

// call is one API call: the same request on every attempt.
type call struct {
	method, path string
	body         []byte // nil for GET
	key          string // "" for GET
}

// exchange is one attempt's answer.
type exchange struct {
	status     int
	body       []byte
	replayed   bool
	retryAfter time.Duration
	requestID  string
}

// run sends cl until an answer is final, and returns that answer with the
// number of attempts made. Answers that are worth retrying, and transport
// errors, are retried within the context and the attempt budget; running
// out of either, or of the retry horizon, is a *GaveUpError.
func (c *Client) run(ctx context.Context, cl call) (*exchange, int, error) {
	if c.configErr != nil {
		return nil, 0, &finalError{c.configErr, 0}
	}
	var last error
	var horizon time.Time
	if c.retryFor > 0 {
		horizon = time.Now().Add(c.retryFor)
	}
	for n := 1; ; n++ {
		start := time.Now()
		ex, err := c.attempt(ctx, cl)
		dur := time.Since(start)
		info := Attempt{N: n, Method: cl.method, Path: cl.path, Key: cl.key, Duration: dur, Err: err}
		if ex != nil {
			info.Status, info.Replayed = ex.status, ex.replayed
		}
		if cerr := ctx.Err(); err != nil && cerr != nil {
			// The caller's context ended during this attempt: the attempt
			// has no outcome of its own, so the previous one's is reported.
			c.notify(info)
			return nil, n, &GaveUpError{Method: cl.method, Path: cl.path, Key: cl.key, Reason: cerr, Last: last, attempts: n}
		}
		var retryAfter time.Duration
		switch {
		case err != nil:
			if !retryableTransport(err) {
				c.notify(info)
				return nil, n, &finalError{fmt.Errorf("chargeonce: %s %s: %w", cl.method, cl.path, err), n}
			}
			last = fmt.Errorf("attempt %d: %w", n, err)
		case !c.retryableStatus(cl, ex.status):
			c.notify(info)
			return ex, n, nil
		default:
			last = responseError(ex, n)
			retryAfter = ex.retryAfter
		}

		if c.maxAttempts > 0 && n >= c.maxAttempts {
			c.notify(info)
			return nil, n, &GaveUpError{Method: cl.method, Path: cl.path, Key: cl.key, Reason: ErrAttemptsExhausted, Last: last, attempts: n}
		}
		wait := max(c.backoff(n), retryAfter)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= wait {
			// The next attempt could only start after the deadline. Waiting
			// for certain failure would only delay the caller.
			c.notify(info)
			return nil, n, &GaveUpError{Method: cl.method, Path: cl.path, Key: cl.key, Reason: context.DeadlineExceeded, Last: last, attempts: n}
		}
		if !horizon.IsZero() && time.Now().Add(wait).After(horizon) {
			c.notify(info)
			return nil, n, &GaveUpError{Method: cl.method, Path: cl.path, Key: cl.key, Reason: ErrRetryWindowExhausted, Last: last, attempts: n}
		}
		info.Wait = wait
		c.notify(info)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, n, &GaveUpError{Method: cl.method, Path: cl.path, Key: cl.key, Reason: ctx.Err(), Last: last, attempts: n}
		}
	}
}

func (c *Client) notify(a Attempt) {
	if c.hook != nil {
		c.hook(a)
	}
}

// retryableStatus reports whether an answer is worth another attempt.
func (c *Client) retryableStatus(cl call, status int) bool {
	switch {
	case status == http.StatusAccepted:
		// A charge's or a refund's 202 (it carries a key): recorded,
		// outcome unknown. A redelivery's or a recovery's 202 is final:
		// queued.
		return cl.method == http.MethodPost && cl.key != ""
	case status == http.StatusConflict, status == http.StatusRequestTimeout, status == http.StatusTooManyRequests:
		return true
	case status >= 500:
		return true
	}
	return false
}

// retryableTransport reports whether an attempt that got no answer is worth
// another. Almost always: the request may or may not have reached the
// service, and the same key makes a retry safe. The exceptions are errors
// that will not change by themselves, such as a certificate the client does
// not trust.
func retryableTransport(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verification     *tls.CertificateVerificationError
		recordHeader     tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &unknownAuthority), errors.As(err, &hostname), errors.As(err, &invalid),
		errors.As(err, &verification), errors.As(err, &recordHeader):
		return false
	}
	return true
}

// backoff returns the wait after the n-th attempt: full jitter over an
// exponentially growing, capped window.
func (c *Client) backoff(n int) time.Duration {
	window := c.backoffMax
	if shift := n - 1; shift < 32 {
		if w := c.backoffBase << shift; w > 0 && w < window {
			window = w
		}
	}
	if window <= 0 {
		return 0
	}
	return rand.N(window + 1) //nolint:gosec // G404: retry jitter, not a secret; math/rand is the right tool
}

// attempt sends cl once and reads the whole answer.
func (c *Client) attempt(ctx context.Context, cl call) (*exchange, error) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if c.attemptTimeout > 0 {
		actx, cancel = context.WithTimeout(ctx, c.attemptTimeout)
	}
	defer cancel()
	ex, err := c.send(actx, cl)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		return nil, fmt.Errorf("%w (%s)", ErrAttemptTimeout, c.attemptTimeout)
	}
	return ex, err
}

func (c *Client) send(ctx context.Context, cl call) (*exchange, error) {
	var body io.Reader
	if cl.body != nil {
		body = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, c.base+cl.path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("User-Agent", userAgent)
	if cl.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cl.key != "" {
		req.Header.Set("Idempotency-Key", keyHeader(cl.key))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		// The status line came but the body did not: for a charge, the
		// work may be done, and a retry replays it.
		return nil, fmt.Errorf("reading the body of a %d answer: %w", resp.StatusCode, err)
	}
	if len(b) > maxResponseBytes {
		return nil, fmt.Errorf("the %d answer is larger than %d bytes", resp.StatusCode, maxResponseBytes)
	}
	return &exchange{
		status:     resp.StatusCode,
		body:       b,
		replayed:   resp.Header.Get("Idempotent-Replayed") == "true",
		retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
		requestID:  resp.Header.Get("Request-Id"),
	}, nil
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an
// HTTP-date (RFC 9110). Anything else is no delay.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}
