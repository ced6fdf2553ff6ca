package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
)

// The clients: each runs intents one after another, over HTTP (retrying as
// the Go client does: the same key and the same body bytes until a final
// answer, backing off with full jitter under any Retry-After), over the
// queue (publishing again until a result arrives), or both at once; some
// intents are replayed, some keys reused with another body.

const (
	// horizon is how long one call keeps trying, like client.WithRetryFor:
	// longer than a lease (2s) plus the acquirer timeout and the longest
	// fault, so a call gives up only when something is really wrong.
	horizon = 20 * time.Second
	// attemptTimeout bounds one HTTP attempt, like client.WithAttemptTimeout.
	attemptTimeout = 3 * time.Second
	backoffBase    = 100 * time.Millisecond
	backoffMax     = 2 * time.Second
	// republishAfter is how long a queue call waits for a result before it
	// publishes the request again.
	republishAfter = 4 * time.Second
	merchant       = "demo"
)

// intent is one customer's wish to pay: one key, one order.
type intent struct {
	ID    int
	Key   string
	Order int64
	Token string
	Via   string // http, queue or both
	Body  []byte // request A
	Alt   []byte // request B: the same key with another amount
}

// tokens are the simulator's test cards, with their weights.
var tokens = []struct {
	token  string
	weight int
}{{"tok_ok", 40}, {"tok_declined", 15}, {"tok_slow", 10}, {"tok_fail_before", 15}, {"tok_fail_after", 20}}

// workload generates intents and runs them.
type workload struct {
	c       *cluster
	h       *history
	seed    uint64
	baseOrd int64

	mu      sync.Mutex
	intents []*intent
	byKey   map[string]int
	five    []time.Time // when an HTTP 500 was answered

	refunds refundLog

	hc      *http.Client
	nc      *nats.Conn
	js      jetstream.JetStream
	results *results
}

func (w *workload) note500() {
	w.mu.Lock()
	w.five = append(w.five, time.Now())
	w.mu.Unlock()
}

func (w *workload) fiveHundreds() []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Time(nil), w.five...)
}

func (w *workload) newIntent(rng *rand.Rand) *intent {
	w.mu.Lock()
	defer w.mu.Unlock()
	id := len(w.intents)
	n, tok := rng.IntN(100), ""
	for _, tw := range tokens {
		if n -= tw.weight; n < 0 {
			tok = tw.token
			break
		}
	}
	via := "http"
	switch r := rng.IntN(100); {
	case r < 20:
		via = "queue"
	case r < 35:
		via = "both"
	}
	order := w.baseOrd + int64(id)
	in := &intent{
		ID: id, Key: fmt.Sprintf("chaos-%d-%d", w.seed, id), Order: order, Token: tok, Via: via,
		Body: []byte(fmt.Sprintf(`{"order_id":%d,"amount_cents":2500,"currency":"BRL","payment_token":%q}`, order, tok)),
		Alt:  []byte(fmt.Sprintf(`{"order_id":%d,"amount_cents":2600,"currency":"BRL","payment_token":%q}`, order, tok)),
	}
	w.intents = append(w.intents, in)
	w.byKey[in.Key] = id
	return in
}

func (w *workload) all() []*intent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*intent(nil), w.intents...)
}

// client runs intents until ctx ends.
func (w *workload) client(ctx context.Context, id int) {
	rng := rand.New(rand.NewPCG(w.seed, uint64(id)+1)) //nolint:gosec // G404: a seeded workload, not a secret
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		in := w.newIntent(rng)
		switch in.Via {
		case "http":
			if rng.IntN(100) < 25 {
				// A replay racing the first call, as a client whose first
				// attempt timed out on another process would send it.
				delay := time.Duration(rng.IntN(500)) * time.Millisecond
				wg.Go(func() {
					time.Sleep(delay)
					w.httpCall(id+1000, in, 1)
				})
			}
			if cid := chargeIDOf(w.httpCall(id, in, 1)); cid != "" && rng.IntN(100) < refundShare {
				// Refunds run beside the client's next intents.
				rrng := rand.New(rand.NewPCG(w.seed, uint64(in.ID)+1<<32)) //nolint:gosec // G404: a seeded workload
				wg.Go(func() { w.refund(id, in, cid, rrng) })
			}
			if rng.IntN(100) < 12 {
				w.httpCall(id, in, 2) // the key reused for another request: 422
			}
		case "queue":
			w.queueCall(id, in, rng)
		case "both":
			var both sync.WaitGroup
			both.Go(func() { w.queueCall(id+2000, in, rng) })
			w.httpCall(id, in, 1)
			both.Wait()
		}
		if rng.IntN(100) < 10 {
			w.httpCall(id, in, 1) // a later replay
		}
		time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
	}
}

// httpCall runs one charge call over HTTP, records it and returns its
// outcome.
func (w *workload) httpCall(client int, in *intent, variant int8) output {
	body := in.Body
	if variant == 2 {
		body = in.Alt
	}
	rec := record{Intent: in.ID, Client: client, In: input{Kind: opCharge, Variant: variant, Via: "http"}, Call: w.h.now()}
	deadline := time.Now().Add(horizon)
	bases := w.c.httpBases()
	rng := rand.New(rand.NewPCG(uint64(in.ID), uint64(client))) //nolint:gosec // G404: jitter
	for n := 1; ; n++ {
		rec.Attempts = n
		status, hdr, b, err := w.post(bases[rng.IntN(len(bases))], in.Key, body)
		var retryAfter time.Duration
		switch {
		case err != nil:
			rec.LastStatus = err.Error()
		case status == 201 || status == 402:
			rec.Out = output{Kind: outFinal, Status: status, Body: string(b)}
		case status == 422:
			rec.Out = output{Kind: outReused, Status: status, Body: string(b)}
		case status == 202 || status == 408 || status == 409 || status == 429 || status >= 500:
			if status == http.StatusInternalServerError {
				w.note500()
			}
			rec.LastStatus = strconv.Itoa(status) + " " + abbreviate(string(b))
			if s, err := strconv.Atoi(hdr.Get("Retry-After")); err == nil {
				retryAfter = time.Duration(s) * time.Second
			}
		default:
			rec.Out = output{Kind: outOther, Status: status, Body: string(b)}
		}
		if rec.Out.Kind != "" {
			break
		}
		wait := max(time.Duration(rng.Int64N(int64(min(backoffMax, backoffBase<<min(n, 10)))+1)), retryAfter)
		if time.Now().Add(wait).After(deadline) {
			rec.Out = output{Kind: outUnknown, Err: "gave up after " + strconv.Itoa(n) + " attempts; last: " + rec.LastStatus}
			break
		}
		time.Sleep(wait)
	}
	rec.Ret = w.h.now()
	w.h.add(rec)
	return rec.Out
}

func (w *workload) post(base, key string, body []byte) (int, http.Header, []byte, error) {
	return w.postTo(base, "/v1/charges", key, body)
}

// postTo makes one POST attempt to path with the idempotency key.
func (w *workload) postTo(base, path, key string, body []byte) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+apitest.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := w.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, b, nil
}

// queueCall publishes the intent's request to the queue, again while no
// result comes, and records the first result as its answer.
func (w *workload) queueCall(client int, in *intent, rng *rand.Rand) {
	rec := record{Intent: in.ID, Client: client, In: input{Kind: opCharge, Variant: 1, Via: "queue"}, Call: w.h.now()}
	ch := w.results.wait(in.Key, rec.Call)
	defer w.results.done(in.Key, ch)
	deadline := time.Now().Add(horizon)
	for n := 1; ; n++ {
		rec.Attempts = n
		m := nats.NewMsg(queue.RequestSubject(merchant))
		m.Header.Set(queue.HeaderIdempotencyKey, in.Key)
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-%d-%d", in.Key, client, n))
		m.Data = in.Body
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		_, err := w.js.PublishMsg(ctx, m)
		cancel()
		if err != nil {
			rec.LastStatus = "publish: " + err.Error()
		}
		if n == 1 && rng.IntN(100) < 20 {
			// A producer that published twice: both are delivered.
			m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-%d-%d-dup", in.Key, client, n))
			ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
			_, _ = w.js.PublishMsg(ctx, m)
			cancel()
		}
		wait := min(republishAfter, time.Until(deadline))
		select {
		case r := <-ch:
			rec.Out = r
		case <-time.After(wait):
		}
		if rec.Out.Kind != "" {
			break
		}
		if time.Now().After(deadline) {
			rec.Out = output{Kind: outUnknown, Err: "no result after " + strconv.Itoa(n) + " publishes; last: " + rec.LastStatus}
			break
		}
	}
	rec.Ret = w.h.now()
	w.h.add(rec)
}

// results reads the results stream and hands each result to the calls
// waiting for its key; every result also goes into the history, as the
// answer of the intent's queue requests (a result published after its
// call ended included).
type results struct {
	h       *history
	mu      sync.Mutex
	waiting map[string][]chan output
	first   map[string]int64 // key -> when its first queue call began
	stop    func()
}

func (w *workload) startResults(ctx context.Context) error {
	r := &results{h: w.h, waiting: map[string][]chan output{}, first: map[string]int64{}}
	w.results = r
	cons, err := w.js.OrderedConsumer(ctx, queue.ResultStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{queue.ResultSubject(merchant)},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return fmt.Errorf("reading results: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		key := m.Headers().Get(queue.HeaderIdempotencyKey)
		status, _ := strconv.Atoi(m.Headers().Get(queue.HeaderStatus))
		o := output{Kind: outOther, Status: status, Body: string(m.Data())}
		switch status {
		case 201, 402:
			o.Kind = outFinal
		case 422:
			o.Kind = outReused
		}
		r.deliver(w, key, o)
	})
	if err != nil {
		return fmt.Errorf("reading results: %w", err)
	}
	r.stop = cc.Stop
	return nil
}

func (r *results) wait(key string, call int64) chan output {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan output, 1)
	r.waiting[key] = append(r.waiting[key], ch)
	if _, ok := r.first[key]; !ok {
		r.first[key] = call
	}
	return ch
}

func (r *results) done(key string, ch chan output) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.waiting[key]
	for i, c := range list {
		if c == ch {
			r.waiting[key] = append(list[:i:i], list[i+1:]...)
			break
		}
	}
}

func (r *results) deliver(w *workload, key string, o output) {
	r.mu.Lock()
	for _, ch := range r.waiting[key] {
		select {
		case ch <- o:
		default:
		}
	}
	first, ok := r.first[key]
	r.mu.Unlock()
	if !ok {
		return // not ours
	}
	w.mu.Lock()
	id, ok := w.byKey[key]
	w.mu.Unlock()
	if !ok {
		return
	}
	// Every result message is an answer to one of the intent's queue
	// requests: it must be the stored answer too.
	w.h.add(record{Intent: id, Client: 3000, In: input{Kind: opCharge, Variant: 1, Via: "queue-result"}, Out: o, Call: first, Ret: w.h.now(), Attempts: 1})
}
