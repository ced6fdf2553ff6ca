package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/recon"
)

// DeliveryTimeout bounds one delivery: the receiver must answer 2xx within
// it (SPEC), connecting included.
const DeliveryTimeout = 15 * time.Second

// Defaults of SenderOptions.
const (
	DefaultEvery       = time.Second
	DefaultWorkers     = 32
	DefaultPerMerchant = 16
	// DefaultLease outlasts a delivery's timeout with room to record it:
	// another instance takes a delivery over only once its sender has
	// surely given up on it (or died).
	DefaultLease      = 4 * DeliveryTimeout
	DefaultStatsEvery = 10 * time.Second
	// MaxResponseHeaderBytes bounds the headers read from a receiver.
	MaxResponseHeaderBytes = 64 << 10
	// claimTimeout bounds a claim, which Stop does not cut short.
	claimTimeout = 10 * time.Second
	// maxRetryAfter caps a receiver's Retry-After.
	maxRetryAfter = 24 * time.Hour
)

// Schedule is how long a failed delivery waits before its next try: after
// the first failure 5 s, then 5 min, … ; after the last, it is given up.
// Each wait is jittered up to 20% longer (never shorter), so deliveries
// failed together do not come back together, and a delivery's tries always
// span WebhookDisableAfter: an endpoint that never answers 2xx is disabled
// before its first delivery is given up.
var Schedule = []time.Duration{
	5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour,
	5 * time.Hour, 10 * time.Hour, 14 * time.Hour, 20 * time.Hour, 24 * time.Hour,
}

// Observer is told what the sender does (metrics.Webhooks implements it).
type Observer interface {
	// Delivery counts one attempt by result: delivered, failed (an answer
	// other than 2xx), error (no answer), gone (410).
	Delivery(result string, latency time.Duration)
	// EndpointDisabled counts an endpoint the sender disabled.
	EndpointDisabled()
	// WebhookStats reports the backlog.
	WebhookStats(st chargeonce.WebhookStats)
}

// SenderOptions configure a Sender; zero values take the defaults.
type SenderOptions struct {
	// Every is how often the sender looks for due deliveries when it has
	// nothing to do.
	Every time.Duration
	// Workers bounds the deliveries in flight in this instance.
	Workers int
	// PerMerchant bounds one merchant's deliveries in flight, so a slow or
	// dead endpoint holds at most that many workers and never delays
	// another merchant's deliveries.
	PerMerchant int
	Lease       time.Duration
	// Scale multiplies Schedule and WebhookDisableAfter (1 when zero);
	// tests shrink them.
	Scale float64
	// AllowPrivate lets deliveries reach loopback, private and link-local
	// addresses, over http too (--webhooks-allow-private).
	AllowPrivate bool
	StatsEvery   time.Duration
	Logger       *slog.Logger
	Observer     Observer
}

// Sender delivers due events to their endpoints. Every instance runs one;
// they share the work through leased claims (WebhookDeliveriesClaim).
type Sender struct {
	store  chargeonce.Store
	o      SenderOptions
	client *http.Client

	mu       sync.Mutex
	inflight map[string]int // merchant -> deliveries in flight
	total    int
	wg       sync.WaitGroup
	wake     chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

// NewSender returns a stopped Sender.
func NewSender(store chargeonce.Store, o SenderOptions) *Sender {
	if o.Every <= 0 {
		o.Every = DefaultEvery
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.PerMerchant <= 0 {
		o.PerMerchant = DefaultPerMerchant
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if o.StatsEvery <= 0 {
		o.StatsEvery = DefaultStatsEvery
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sender{
		store: store, o: o, inflight: map[string]int{}, wake: make(chan struct{}, 1),
		client: newClient(o.AllowPrivate, o.PerMerchant),
	}
}

// newClient is the HTTP client deliveries go out with: the SSRF-checking
// dialer, no proxy, no redirect, bounded headers and times.
func newClient(allowPrivate bool, idlePerHost int) *http.Client {
	tr := &http.Transport{
		Proxy:                 nil, // a proxy would connect where the dialer cannot check
		DialContext:           Dialer(allowPrivate).DialContext,
		TLSHandshakeTimeout:   DeliveryTimeout,
		ResponseHeaderTimeout: DeliveryTimeout,
		MaxIdleConnsPerHost:   idlePerHost,
		// A receiver's headers are read up to this much, then the
		// delivery fails (the default is 10 MiB per delivery in flight).
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
		IdleConnTimeout:        90 * time.Second,
		ForceAttemptHTTP2:      true,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   DeliveryTimeout,
		// A delivery follows no redirect: a 3xx is a failed delivery.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Start runs the sender until Stop. It returns at once.
func (s *Sender) Start(ctx context.Context) {
	if s.done != nil {
		return
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	// The backlog is counted apart from dispatch: counting a large one
	// takes a while, and deliveries must not wait for it.
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		stats := time.NewTicker(s.o.StatsEvery)
		defer stats.Stop()
		for {
			s.reportStats(ctx)
			select {
			case <-ctx.Done():
				return
			case <-stats.C:
			}
		}
	}()
	go func() {
		defer close(s.done)
		defer func() { <-statsDone }()
		poll := time.NewTicker(s.o.Every)
		defer poll.Stop()
		for {
			s.dispatch(ctx)
			select {
			case <-ctx.Done():
				s.wg.Wait()
				return
			case <-poll.C:
			case <-s.wake:
			}
		}
	}()
}

// Stop ends the sender and waits for the deliveries in flight to finish
// (DeliveryTimeout at most). A sender that dies instead leaves its claims
// to end with their lease; the deliveries are then sent again.
func (s *Sender) Stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
}

// RunOnce delivers what is due, round after round (each bounded by
// Workers and PerMerchant), until a round finds nothing, and returns how
// many deliveries it made. Tests call it directly.
func (s *Sender) RunOnce(ctx context.Context) int {
	total := 0
	for {
		n := s.dispatch(ctx)
		s.wg.Wait()
		if n == 0 {
			return total
		}
		total += n
	}
}

func (s *Sender) reportStats(ctx context.Context) {
	if s.o.Observer == nil {
		return
	}
	st, err := s.store.WebhookStats(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.o.Logger.Warn("webhooks: counting pending deliveries", "err", err)
		}
		return
	}
	s.o.Observer.WebhookStats(st)
}

// dispatch claims as many due deliveries as it has free workers, none of a
// merchant that already has PerMerchant in flight, and starts them.
func (s *Sender) dispatch(ctx context.Context) int {
	s.mu.Lock()
	free := s.o.Workers - s.total
	var skip []string
	for m, n := range s.inflight {
		if n >= s.o.PerMerchant {
			skip = append(skip, m)
		}
	}
	s.mu.Unlock()
	if free <= 0 || ctx.Err() != nil {
		return 0
	}
	// The claim runs apart from ctx: a claim cut short by Stop may have
	// committed all the same, and its rows would then stay claimed, sent by
	// no one, until the lease ends. Once made, it is delivered.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	ds, err := s.store.WebhookDeliveriesClaim(cctx, s.o.Lease, free, s.o.PerMerchant, skip)
	cancel()
	if err != nil {
		s.o.Logger.Warn("webhooks: claiming deliveries", "err", err)
		return 0
	}
	s.mu.Lock()
	for _, d := range ds {
		s.inflight[d.Event.MerchantID]++
		s.total++
	}
	s.mu.Unlock()
	// A delivery under way finishes, and is recorded, even when the sender
	// stops meanwhile (Stop waits for it, DeliveryTimeout at most): a
	// delivery cut short would hold its claim until the lease ends.
	dctx := context.WithoutCancel(ctx)
	for _, d := range ds {
		s.wg.Go(func() {
			defer s.release(d.Event.MerchantID)
			s.deliver(dctx, d)
		})
	}
	return len(ds)
}

func (s *Sender) release(merchant string) {
	s.mu.Lock()
	s.total--
	if s.inflight[merchant]--; s.inflight[merchant] <= 0 {
		delete(s.inflight, merchant)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Body renders an event as it is delivered: data.object is the object the
// event is about as the API shows it (see EventObject).
func Body(ev chargeonce.WebhookEvent, object []byte) ([]byte, error) {
	return json.Marshal(struct {
		ID        string `json:"id"`
		Type      string `json:"type"`
		CreatedAt string `json:"created_at"`
		Data      struct {
			Object json.RawMessage `json:"object"`
		} `json:"data"`
	}{ID: ev.ID, Type: ev.Type, CreatedAt: ev.CreatedAt.UTC().Format(time.RFC3339Nano), Data: struct {
		Object json.RawMessage `json:"object"`
	}{object}})
}

// EventObject reads and renders the object an event is about, as the API
// shows it: the refund for refund.created, refund.updated and
// refund.failed, the charge otherwise (a settlement, charge.refunded).
func EventObject(ctx context.Context, store chargeonce.Store, ev chargeonce.WebhookEvent) ([]byte, error) {
	if rs, ok := store.(chargeonce.ReconStore); ok && ev.Type == chargeonce.EventReconciliationCompleted {
		m, err := rs.ReconMerchantRunGet(ctx, ev.MerchantID, ev.ObjectID)
		if err != nil {
			return nil, err
		}
		return recon.EncodeMerchantRun(m), nil
	}
	if ev.ObjectID != "" && strings.HasPrefix(ev.Type, "refund.") {
		rf, err := store.RefundGet(ctx, ev.MerchantID, ev.ObjectID)
		if err != nil {
			return nil, err
		}
		return engine.EncodeRefund(&rf), nil
	}
	ch, err := store.ChargeGet(ctx, ev.MerchantID, ev.ChargeID)
	if err != nil {
		return nil, err
	}
	return engine.EncodeCharge(&ch), nil
}

// deliver makes one attempt and records it.
func (s *Sender) deliver(ctx context.Context, d chargeonce.WebhookDelivery) {
	log := s.o.Logger.With("event", d.Event.ID, "endpoint", d.Endpoint.ID, "merchant", d.Event.MerchantID, "attempt", d.Attempts+1)
	object, err := EventObject(ctx, s.store, d.Event)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("webhooks: reading the event's object; the delivery is retried when its lease ends", "err", err)
		}
		return
	}
	body, err := Body(d.Event, object)
	if err != nil {
		log.Error("webhooks: encoding event", "err", err)
		return
	}
	o := s.attempt(ctx, d, body)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	disabled, err := s.store.WebhookDeliveryFinish(wctx, d, o)
	if s.o.Observer != nil {
		s.o.Observer.Delivery(result(o), o.Attempt.Latency)
		if disabled {
			s.o.Observer.EndpointDisabled()
		}
	}
	switch {
	case chargeonce.ErrorCode(err) == chargeonce.ESTALE:
		log.Info("webhooks: the delivery's lease ended before it was recorded; another sender has it")
	case err != nil:
		log.Warn("webhooks: recording delivery", "err", err)
	}
	if disabled {
		log.Warn("webhooks: endpoint disabled", "url", RedactURL(d.Endpoint.URL), "reason", cmpOr(o.Disable, "failing for "+s.disableAfter().String()))
	}
	if !o.Delivered {
		log.Info("webhooks: delivery failed", "url", RedactURL(d.Endpoint.URL), "status", o.Attempt.StatusCode, "err", o.Attempt.Error, "retry_in", o.RetryIn)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func result(o chargeonce.WebhookOutcome) string {
	switch {
	case o.Delivered:
		return "delivered"
	case o.Disable != "":
		return "gone"
	case o.Attempt.StatusCode == 0:
		return "error"
	default:
		return "failed"
	}
}

func (s *Sender) disableAfter() time.Duration {
	return time.Duration(float64(chargeonce.WebhookDisableAfter) * s.o.Scale)
}

// attempt sends body once and decides what comes next. Its error never
// holds the endpoint URL's secrets (RedactURL): merchants and operators
// read it.
func (s *Sender) attempt(ctx context.Context, d chargeonce.WebhookDelivery, body []byte) chargeonce.WebhookOutcome {
	o := s.send(ctx, d, body)
	if o.Attempt.Error != "" {
		o.Attempt.Error = scrub(o.Attempt.Error, d.Endpoint.URL)
	}
	return o
}

func (s *Sender) send(ctx context.Context, d chargeonce.WebhookDelivery, body []byte) chargeonce.WebhookOutcome {
	o := chargeonce.WebhookOutcome{DisableAfter: s.disableAfter()}
	o.Attempt = chargeonce.WebhookAttempt{EventID: d.Event.ID, EndpointID: d.Endpoint.ID}
	now := time.Now()
	sig, err := Sign(d.Endpoint.Secrets(now), d.Event.ID, now, body)
	if err != nil {
		o.Attempt.Error = err.Error()
		o.RetryIn = s.retryIn(d.Attempts, 0)
		return o
	}
	if err := CheckURL(d.Endpoint.URL, s.o.AllowPrivate); err != nil {
		o.Attempt.Error = err.Error()
		o.RetryIn = s.retryIn(d.Attempts, 0)
		return o
	}
	rctx, cancel := context.WithTimeout(ctx, DeliveryTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.Endpoint.URL, strings.NewReader(string(body)))
	if err != nil {
		o.Attempt.Error = err.Error()
		o.RetryIn = s.retryIn(d.Attempts, 0)
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "chargeonce-webhooks/1")
	req.Header.Set(HeaderID, d.Event.ID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(HeaderSignature, sig)
	start := time.Now()
	resp, err := s.client.Do(req)
	o.Attempt.Latency = time.Since(start)
	if err != nil {
		o.Attempt.Error = describe(redactErr(err))
		o.RetryIn = s.retryIn(d.Attempts, 0)
		return o
	}
	// Drain a little so the connection can be reused; the body is not read.
	_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
	o.Attempt.StatusCode = resp.StatusCode
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		o.Delivered = true
	case resp.StatusCode == http.StatusGone:
		o.Disable = "the endpoint answered 410 Gone"
	default:
		var after time.Duration
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			after = retryAfter(resp.Header.Get("Retry-After"), time.Now())
		}
		o.RetryIn = s.retryIn(d.Attempts, after)
	}
	return o
}

// retryIn is the wait after the failure of attempt number attempts+1: the
// receiver's Retry-After when it gave one, else the schedule's step,
// scaled and jittered; zero once the schedule is spent.
func (s *Sender) retryIn(attempts int, after time.Duration) time.Duration {
	if attempts >= len(Schedule) {
		return 0
	}
	if after > 0 {
		return after
	}
	return jitter(time.Duration(float64(Schedule[attempts])*s.o.Scale), rand.Float64()) //nolint:gosec // G404: jitter, not a secret
}

// jitter lengthens a wait by up to 20% (u in [0, 1)), 1 ms at least. It
// never shortens one: the schedule's sum must stay above
// WebhookDisableAfter.
func jitter(d time.Duration, u float64) time.Duration {
	return max(time.Duration(float64(d)*(1+0.2*u)), time.Millisecond)
}

// retryAfter parses a Retry-After header (seconds or an HTTP date).
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return min(time.Duration(n)*time.Second, maxRetryAfter)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter)
	}
	return 0
}

// describe says why a delivery got no answer.
func describe(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("no answer within %s", DeliveryTimeout)
	}
	return err.Error()
}
