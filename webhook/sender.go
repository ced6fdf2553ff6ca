package webhook

import (
	"bytes"
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
	DefaultEvery = time.Second
	// DefaultWorkers bounds the deliveries one instance holds claimed.
	DefaultWorkers = 512
	// DefaultPerMerchant bounds one merchant's not yet answered: eight
	// times an endpoint's default concurrency, so that a claim (taken when
	// half of them are answered) brings a batch while batches are out, and
	// the claims' round trips do not bound a merchant's rate (with 32, one
	// merchant's deliveries ran at 50-110 a second on a loaded machine,
	// half its settlements).
	DefaultPerMerchant = 8 * chargeonce.DefaultEndpointConcurrency
	// reserveShare is the share of Workers kept for merchants with nothing
	// in flight (Workers/reserveShare): a claim for the others leaves it
	// free. Four merchants whose receivers never answered held all 512
	// workers for a delivery's 15 s timeout, and every other merchant's
	// deliveries waited for them (up to 28 s; issue 48).
	reserveShare = 8
	// reservePerMerchant bounds what one merchant takes of the reserve in
	// a claim, so that a few more merchants with dead receivers do not
	// take it all at once: half an endpoint's default concurrency.
	reservePerMerchant = chargeonce.DefaultEndpointConcurrency / 2
	// DefaultLease outlasts a delivery's timeout with room to record it:
	// another instance takes a delivery over only once its sender has
	// surely given up on it (or died).
	DefaultLease      = 4 * DeliveryTimeout
	DefaultStatsEvery = 10 * time.Second
	// MaxResponseHeaderBytes bounds the headers read from a receiver.
	MaxResponseHeaderBytes = 64 << 10
	// claimTimeout bounds a claim, which Stop does not cut short.
	claimTimeout = 10 * time.Second
	// recordTimeout bounds the recording of a batch of attempts.
	recordTimeout = 10 * time.Second
	// maxRecordBatch bounds the attempts recorded in one statement.
	maxRecordBatch = 256
	// claimGap is the least time between two claims, and between two
	// records of attempts, while deliveries flow, and the first wait after
	// a round that found work (each empty round after it doubles the wait,
	// up to Every): what settles, or comes back, meanwhile is claimed, or
	// recorded, in one statement rather than a few at a time. Woken at once
	// after every recorded batch and every settlement, the sender claimed
	// 3.8 deliveries a claim under bench --webhooks at 16 clients, and each
	// claim, charge read and record is a statement and a commit of its own.
	// A sender that waited a whole Every after catching up would let a
	// second's deliveries pile up.
	claimGap = 10 * time.Millisecond
	// objectReads bounds the sender's reads of events' objects at once (a
	// refund's, or on a store that does not read them with the claim):
	// with its one claim and its one recorder, the sender holds at most
	// four of the store's connections, whatever its backlog, and never
	// starves charges of the pool.
	objectReads = 2
	// maxRetryAfter caps a receiver's Retry-After.
	maxRetryAfter = 24 * time.Hour
	// nudgeWindow is how long after its last claimed delivery a merchant's
	// settlements still wake an idle sender (Nudge).
	nudgeWindow = 10 * time.Minute
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
	// had nothing to do for a while.
	Every time.Duration
	// Workers bounds the deliveries this instance holds claimed: sending,
	// waiting for their endpoint's turn, or being recorded. It bounds the
	// sender's memory whatever the backlog.
	Workers int
	// PerMerchant bounds one merchant's claimed deliveries not yet
	// answered, so a slow or dead endpoint holds at most that many and
	// never delays another merchant's deliveries. How many of an
	// endpoint's are sent at once is its own max_concurrency
	// (chargeonce.WebhookEndpoint.Concurrency).
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
//
// One loop claims due deliveries in batches (one statement for up to
// Workers of them, with the charges their events are about); each
// endpoint's claimed deliveries wait in its lane and go out at most its
// max_concurrency at a time, over kept-alive connections; one recorder
// writes the attempts that came back meanwhile in one statement
// (WebhookDeliveriesFinish). A delivery costs no statement of its own
// when it succeeds.
type Sender struct {
	store  chargeonce.Store
	o      SenderOptions
	client *http.Client

	mu       sync.Mutex
	inflight map[string]int   // merchant -> deliveries claimed and not yet answered
	total    int              // deliveries claimed and not yet recorded
	lanes    map[string]*lane // endpoint -> its claimed deliveries not yet sent
	claimed  sync.WaitGroup   // one per delivery claimed and not yet recorded or dropped
	senders  sync.WaitGroup   // the lanes' goroutines
	wake     chan struct{}
	nudge    chan struct{}
	// recent holds the merchants whose deliveries this sender claimed
	// lately, with when (unix nanoseconds): their settlements nudge it.
	recent  sync.Map
	results chan chargeonce.WebhookFinish
	reads   chan struct{} // objectReads tokens

	cancel context.CancelFunc
	done   chan struct{}
}

// lane is an endpoint's claimed deliveries waiting to be sent, and how many
// of its goroutines send them.
type lane struct {
	queue   []claimedDelivery
	running int
}

type claimedDelivery struct {
	d  chargeonce.WebhookDelivery
	at time.Time // when it was claimed, by this instance's clock
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
		store: store, o: o, inflight: map[string]int{}, lanes: map[string]*lane{}, wake: make(chan struct{}, 1), nudge: make(chan struct{}, 1),
		// Never full: it holds at most the deliveries claimed.
		results: make(chan chargeonce.WebhookFinish, o.Workers),
		reads:   make(chan struct{}, objectReads),
		client:  newClient(o.AllowPrivate, o.Workers),
	}
}

// newClient is the HTTP client deliveries go out with: the SSRF-checking
// dialer, no proxy, no redirect, bounded headers and times. It keeps up to
// an endpoint's largest concurrency of connections to it alive between
// deliveries, so a stream of deliveries costs no connection each.
func newClient(allowPrivate bool, idle int) *http.Client {
	tr := &http.Transport{
		Proxy:                 nil, // a proxy would connect where the dialer cannot check
		DialContext:           Dialer(allowPrivate).DialContext,
		TLSHandshakeTimeout:   DeliveryTimeout,
		ResponseHeaderTimeout: DeliveryTimeout,
		MaxIdleConns:          max(idle, chargeonce.MaxEndpointConcurrency),
		MaxIdleConnsPerHost:   chargeonce.MaxEndpointConcurrency,
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
	stopRecorder := s.startRecorder(ctx)
	go func() {
		defer close(s.done)
		defer func() { <-statsDone }()
		poll := time.NewTimer(0)
		defer poll.Stop()
		var (
			idle time.Duration
			last time.Time // the last claim
			// soon brings the next claim forward to claimGap after the
			// last one (at once when that has passed).
			soon = func() {
				idle = min(idle, claimGap)
				poll.Reset(max(0, claimGap-time.Since(last)))
			}
		)
		for {
			select {
			case <-ctx.Done():
				s.senders.Wait()
				stopRecorder()
				return
			case <-poll.C:
			case <-s.wake:
				// Room was freed: claim again, but not within claimGap
				// of the last claim.
				if time.Since(last) < claimGap {
					soon()
					continue
				}
			case <-s.nudge:
				// A settlement that likely owes a delivery: look again
				// claimGap after the last claim rather than after the
				// idle back-off (up to Every).
				if idle > claimGap {
					soon()
				}
				continue
			}
			n := s.dispatch(ctx)
			last = time.Now()
			// The next look: claimGap after a round that found work,
			// then less and less often, up to Every.
			switch {
			case n > 0:
				idle = claimGap
			case idle > 0:
				idle = min(2*idle, s.o.Every)
			default:
				idle = s.o.Every
			}
			poll.Reset(idle)
		}
	}()
}

// Stop ends the sender and waits for the deliveries it claimed to be sent
// and recorded (each answered within DeliveryTimeout). A sender that dies
// instead leaves its claims to end with their lease; the deliveries are
// then sent again.
func (s *Sender) Stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
}

// Nudge tells the sender that a record of merchant was just settled, its
// event written: when this sender claimed deliveries of that merchant
// lately (nudgeWindow), the settlement likely owes one too, and a sender
// idling after a quiet spell looks again claimGap after its last claim
// instead of up to Every later. Settlements of merchants it has not delivered to
// lately are found by the polls. It never blocks; the engine calls it
// after every settlement (engine.Options.Settled).
func (s *Sender) Nudge(merchant string) {
	v, ok := s.recent.Load(merchant)
	if !ok || time.Since(time.Unix(0, v.(int64))) > nudgeWindow {
		return
	}
	select {
	case s.nudge <- struct{}{}:
	default:
	}
}

// RunOnce delivers what is due, round after round (each bounded by
// Workers and PerMerchant), until a round finds nothing, and returns how
// many deliveries it made. Tests call it directly.
func (s *Sender) RunOnce(ctx context.Context) int {
	stopRecorder := s.startRecorder(ctx)
	defer stopRecorder()
	total := 0
	for {
		n := s.dispatch(ctx)
		s.claimed.Wait()
		if n == 0 {
			s.senders.Wait()
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

// dispatch claims as many due deliveries as there is room for (Workers in
// all, PerMerchant of a merchant), in one statement, and hands them to
// their endpoints' lanes. A merchant with less than half its room free is
// skipped, so that claims come in batches rather than one per delivery
// recorded. A reserve of the workers (Workers/reserveShare) is left to
// merchants with nothing in flight: once the others have taken the rest,
// a claim skips every merchant with deliveries in flight, so that a few
// merchants whose receivers never answer cannot hold every worker while
// another merchant's deliveries wait.
func (s *Sender) dispatch(ctx context.Context) int {
	s.mu.Lock()
	free := s.o.Workers - s.total
	reserve := max(1, s.o.Workers/reserveShare)
	perMerchant := s.o.PerMerchant
	var skip, busy []string
	for m, n := range s.inflight {
		busy = append(busy, m)
		room := s.o.PerMerchant - n
		if room < (s.o.PerMerchant+1)/2 {
			skip = append(skip, m)
			continue
		}
		perMerchant = min(perMerchant, room)
	}
	s.mu.Unlock()
	if ctx.Err() != nil {
		return 0
	}
	limit := free - reserve
	switch {
	case limit > 0 && (limit >= (s.o.Workers+3)/4 || limit >= s.o.PerMerchant):
		// Every merchant not skipped, the reserve left free.
	case free > 0 && len(busy) > 0:
		// The reserve: merchants with nothing in flight, a few each.
		limit, skip, perMerchant = free, busy, min(s.o.PerMerchant, reservePerMerchant)
	case free >= (s.o.Workers+3)/4 || free >= s.o.PerMerchant:
		// Nothing in flight: all of it.
		limit = free
	default:
		return 0
	}
	// The claim runs apart from ctx: a claim cut short by Stop may have
	// committed all the same, and its rows would then stay claimed, sent by
	// no one, until the lease ends. Once made, it is delivered.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	ds, err := s.store.WebhookDeliveriesClaim(cctx, s.o.Lease, limit, perMerchant, skip)
	cancel()
	if err != nil {
		s.o.Logger.Warn("webhooks: claiming deliveries", "err", err)
		return 0
	}
	now := time.Now()
	s.remember(ds, now)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range ds {
		s.inflight[d.Event.MerchantID]++
		s.total++
		s.claimed.Add(1)
		l := s.lanes[d.Endpoint.ID]
		if l == nil {
			l = &lane{}
			s.lanes[d.Endpoint.ID] = l
		}
		l.queue = append(l.queue, claimedDelivery{d: d, at: now})
		// A delivery under way finishes, and is recorded, even when the
		// sender stops meanwhile (Stop waits for it, DeliveryTimeout at
		// most): a delivery cut short would hold its claim until the lease
		// ends.
		if l.running < d.Endpoint.Concurrency() {
			l.running++
			s.senders.Go(func() { s.runLane(ctx, d.Endpoint.ID, l) })
		}
	}
	return len(ds)
}

// remember notes the merchants of the claimed deliveries ds as delivered
// to lately (Nudge), and forgets those whose last claim is older than
// nudgeWindow.
func (s *Sender) remember(ds []chargeonce.WebhookDelivery, now time.Time) {
	last := ""
	for _, d := range ds {
		if m := d.Event.MerchantID; m != last {
			s.recent.Store(m, now.UnixNano())
			last = m
		}
	}
	if len(ds) == 0 {
		s.recent.Range(func(k, v any) bool {
			if now.Sub(time.Unix(0, v.(int64))) > nudgeWindow {
				s.recent.Delete(k)
			}
			return true
		})
	}
}

// runLane sends an endpoint's claimed deliveries one after the other until
// its lane is empty; an endpoint has up to its concurrency of these.
func (s *Sender) runLane(ctx context.Context, endpoint string, l *lane) {
	// What is claimed is sent, and recorded, even when the sender stops
	// meanwhile: Stop waits for it (its claim would otherwise hold it
	// until the lease ends, while a restarted sender waits).
	dctx := context.WithoutCancel(ctx)
	for {
		s.mu.Lock()
		if len(l.queue) == 0 {
			if l.running--; l.running == 0 {
				delete(s.lanes, endpoint)
			}
			s.mu.Unlock()
			return
		}
		c := l.queue[0]
		l.queue[0] = claimedDelivery{}
		l.queue = l.queue[1:]
		s.mu.Unlock()
		// A delivery whose lease could end before it is answered and
		// recorded is not sent: another sender may have it by then. It is
		// sent again once the lease ends.
		if time.Since(c.at) > s.sendWithin() {
			s.sent(c.d.Event.MerchantID)
			s.release()
			continue
		}
		f, ok := s.deliver(dctx, c.d)
		s.sent(c.d.Event.MerchantID)
		if ok {
			s.results <- f
		} else {
			s.release()
		}
	}
}

// sendWithin is how long after its claim a delivery may still be sent:
// its answer and its record must come before the lease ends. Tests with a
// short lease get half of it.
func (s *Sender) sendWithin() time.Duration {
	return max(s.o.Lease-DeliveryTimeout-recordTimeout, s.o.Lease/2)
}

// sent frees a merchant's place taken by a delivery that has been
// answered (or will not be sent): its recording does not hold the merchant
// back.
func (s *Sender) sent(merchant string) {
	s.mu.Lock()
	if s.inflight[merchant]--; s.inflight[merchant] <= 0 {
		delete(s.inflight, merchant)
	}
	s.mu.Unlock()
}

// release forgets a claimed delivery: recorded, or left to its lease.
func (s *Sender) release() {
	s.mu.Lock()
	s.total--
	s.mu.Unlock()
	s.claimed.Done()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// startRecorder runs the recorder until the returned stop, which waits
// for it to record what the lanes left. Call stop once no lane runs.
func (s *Sender) startRecorder(ctx context.Context) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		s.record(context.WithoutCancel(ctx), quit)
	}()
	return func() {
		close(quit)
		<-done
	}
}

// record writes the attempts as they come back, as many at once as have
// come back since the previous batch was written, and no sooner than
// claimGap after it: one statement for a batch of successes, and no wait
// when they come one at a time, apart.
func (s *Sender) record(ctx context.Context, quit <-chan struct{}) {
	batch := make([]chargeonce.WebhookFinish, 0, maxRecordBatch)
	var last time.Time // the last write
	gap := time.NewTimer(0)
	defer gap.Stop()
	for {
		batch = batch[:0]
		select {
		case f := <-s.results:
			batch = append(batch, f)
		case <-quit:
			select {
			case f := <-s.results:
				batch = append(batch, f)
			default:
				return
			}
		}
		// What comes back within claimGap of the last write joins this
		// one; when stopping, only what has come back.
		gap.Reset(max(0, claimGap-time.Since(last)))
	more:
		for len(batch) < maxRecordBatch {
			select {
			case f := <-s.results:
				batch = append(batch, f)
			case <-gap.C:
				break more
			case <-quit:
				for len(batch) < maxRecordBatch {
					select {
					case f := <-s.results:
						batch = append(batch, f)
					default:
						break more
					}
				}
				break more
			}
		}
		last = time.Now()
		wctx, cancel := context.WithTimeout(ctx, recordTimeout)
		s.store.WebhookDeliveriesFinish(wctx, batch)
		cancel()
		for i := range batch {
			s.recorded(batch[i])
			batch[i] = chargeonce.WebhookFinish{}
		}
	}
}

// recorded counts, logs and releases one recorded delivery.
func (s *Sender) recorded(f chargeonce.WebhookFinish) {
	defer s.release()
	d, o := f.Delivery, f.Outcome
	if s.o.Observer != nil {
		s.o.Observer.Delivery(result(o), o.Attempt.Latency)
		if f.Disabled {
			s.o.Observer.EndpointDisabled()
		}
	}
	if f.Err == nil && !f.Disabled && o.Delivered {
		return
	}
	log := s.o.Logger.With("event", d.Event.ID, "endpoint", d.Endpoint.ID, "merchant", d.Event.MerchantID, "attempt", d.Attempts+1)
	switch {
	case chargeonce.ErrorCode(f.Err) == chargeonce.ESTALE:
		log.Info("webhooks: the delivery's lease ended before it was recorded; another sender has it")
	case f.Err != nil:
		log.Warn("webhooks: recording delivery", "err", f.Err)
	}
	if f.Disabled {
		log.Warn("webhooks: endpoint disabled", "url", RedactURL(d.Endpoint.URL), "reason", cmpOr(o.Disable, "failing for "+s.disableAfter().String()))
	}
	if !o.Delivered {
		log.Info("webhooks: delivery failed", "url", RedactURL(d.Endpoint.URL), "status", o.Attempt.StatusCode, "err", o.Attempt.Error, "retry_in", o.RetryIn)
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

// deliver makes one attempt, to be recorded; false when there is nothing
// to record (the event's object could not be read: the delivery is sent
// again when its lease ends).
func (s *Sender) deliver(ctx context.Context, d chargeonce.WebhookDelivery) (chargeonce.WebhookFinish, bool) {
	var (
		object []byte
		err    error
	)
	if d.Charge != nil {
		object = engine.EncodeCharge(d.Charge)
	} else {
		s.reads <- struct{}{}
		object, err = EventObject(ctx, s.store, d.Event)
		<-s.reads
	}
	if err != nil {
		if ctx.Err() == nil {
			s.o.Logger.Warn("webhooks: reading the event's object; the delivery is retried when its lease ends",
				"event", d.Event.ID, "endpoint", d.Endpoint.ID, "merchant", d.Event.MerchantID, "err", err)
		}
		return chargeonce.WebhookFinish{}, false
	}
	body, err := Body(d.Event, object)
	if err != nil {
		s.o.Logger.Error("webhooks: encoding event", "event", d.Event.ID, "err", err)
		return chargeonce.WebhookFinish{}, false
	}
	return chargeonce.WebhookFinish{Delivery: d, Outcome: s.attempt(ctx, d, body)}, true
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
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.Endpoint.URL, bytes.NewReader(body))
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
