package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/queue"
)

// burstIntents is how many intents TestQueueBurstWorkerKilled sends. Each
// is published two or three times, so about 2.5 times as many messages.
const burstIntents = 1000

// TestQueueBurstWorkerKilled publishes a burst in which every intent is
// sent 2–3 times (twice with different Nats-Msg-Ids, so both are stored
// and delivered; some a third time with a repeated id, which JetStream
// drops), to two competing `chargeonce worker` processes. One is SIGKILLed
// mid-burst and restarted. Afterwards: exactly one capture per approved
// intent at the stand-alone acquirer, one charge per intent, at least one
// result per intent and all of an intent's results identical, nothing
// pending or unacked on the consumer, and an empty outbox.
func TestQueueBurstWorkerKilled(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	ns := natstest.Start(t)
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer")

	js := natstest.JetStream(t, ns.URL)
	// The workers create the streams too; creating them here first lets
	// the burst start before either worker is up.
	if err := queue.EnsureStreams(t.Context(), js, queue.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	args := []string{"worker", "--nats", ns.URL, "--db", dbURL, "--acquirer", acq.URL(),
		"--acquirer-timeout", "2s", "--lease", "4s", "--ack-wait", "5s", "--reconcile-every", "1s",
		"--outbox-every", "200ms", "--max-deliver", "50", "--concurrency", "32", "--log-level", "warn"}
	a := ps.start("worker-a", args...)
	ps.start("worker-b", args...)

	type intent struct {
		key, body string
		declined  bool
	}
	base := newOrder()
	intents := make([]intent, burstIntents)
	var sends []*nats.Msg
	for i := range intents {
		token := "tok_ok"
		if i%10 == 0 {
			token = "tok_declined"
		}
		in := intent{key: fmt.Sprintf("burst-%d", i), body: string(chargeBody(base+int64(i), token)), declined: token == "tok_declined"}
		intents[i] = in
		ids := []string{"a-" + in.key, "b-" + in.key}
		if i%2 == 1 {
			ids = append(ids, "a-"+in.key) // a producer's retry: dropped by the stream
		}
		for _, id := range ids {
			m := nats.NewMsg(queue.RequestSubject("demo"))
			m.Header.Set(queue.HeaderIdempotencyKey, in.key)
			m.Header.Set(jetstream.MsgIDHeader, id)
			m.Data = []byte(in.body)
			sends = append(sends, m)
		}
	}
	rand.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })

	start := time.Now()
	var stored uint64
	for _, m := range sends {
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatal("the burst was not acknowledged within 60s")
	}
	published := time.Since(start)
	si, err := js.Stream(t.Context(), queue.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	stored = si.CachedInfo().State.Msgs

	// Kill worker A once about a third of the stored messages are acked.
	cons := func() *jetstream.ConsumerInfo {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		c, err := js.Consumer(ctx, queue.RequestStream, queue.DefaultDurable)
		if err != nil {
			return nil
		}
		info, err := c.Info(ctx)
		if err != nil {
			return nil
		}
		return info
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if info := cons(); info != nil && info.AckFloor.Stream >= stored/3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a third of the burst was not acked within 60s: %+v", cons())
		}
		time.Sleep(20 * time.Millisecond)
	}
	killedAt := cons()
	a.kill()
	t.Logf("worker-a SIGKILLed with %d of %d stored messages acked, %d unacked", killedAt.AckFloor.Stream, stored, killedAt.NumAckPending)
	time.Sleep(300 * time.Millisecond)
	a.run(false)

	// Done: nothing pending or unacked, no record processing, the outbox
	// empty.
	deadline = time.Now().Add(90 * time.Second)
	for {
		info := cons()
		processing := queryInt(t, dbURL, "SELECT count(*) FROM idempotency_keys WHERE state = 'processing'")
		outbox := queryInt(t, dbURL, "SELECT count(*) FROM outbox")
		if info != nil && info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0 && processing == 0 && outbox == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the burst did not finish within 90s: consumer %+v, %d processing, %d in the outbox", info, processing, outbox)
		}
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(start)

	results := natstest.ReadAll(t, js, queue.ResultStream, queue.ResultSubject("demo"))
	byKey := map[string][]natstest.Message{}
	for _, r := range results {
		k := r.Header.Get(queue.HeaderIdempotencyKey)
		byKey[k] = append(byKey[k], r)
	}
	approved := 0
	for _, in := range intents {
		rs := byKey[in.key]
		if len(rs) == 0 {
			t.Fatalf("%s: no result", in.key)
		}
		want := "201"
		if in.declined {
			want = "402"
		} else {
			approved++
		}
		for _, r := range rs {
			if r.Header.Get(queue.HeaderStatus) != want || !bytes.Equal(r.Data, rs[0].Data) {
				t.Fatalf("%s: results differ or are not %s: %v %q / %q", in.key, want, r.Header, r.Data, rs[0].Data)
			}
		}
	}
	if len(byKey) != len(intents) {
		t.Fatalf("results for %d keys, want %d", len(byKey), len(intents))
	}

	stats, err := acquirerClient(acq).Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var charges, doubled, captured int64
	db(t, dbURL, func(conn *pgx.Conn) error {
		return conn.QueryRow(t.Context(), `
SELECT (SELECT count(*) FROM charges),
       (SELECT count(*) FROM (SELECT order_id FROM charges GROUP BY order_id HAVING count(*) > 1) d),
       (SELECT count(*) FROM charges WHERE status = 'captured')`).Scan(&charges, &doubled, &captured)
	})
	if charges != int64(len(intents)) || doubled != 0 || captured != int64(approved) || stats.Captures != int64(approved) {
		t.Fatalf("%d charges for %d intents, %d orders charged twice, %d captured charges, %d acquirer captures; want %d captures",
			charges, len(intents), doubled, captured, stats.Captures, approved)
	}
	var redelivered uint64
	if info := cons(); info != nil {
		redelivered = info.Delivered.Consumer - info.Delivered.Stream
	}
	t.Logf("burst: %d intents, %d messages published, %d stored (JetStream dropped %d repeated ids), %d results (%d keys)",
		len(intents), len(sends), stored, uint64(len(sends))-stored, len(results), len(byKey))
	t.Logf("burst: %d approved, %d acquirer captures (%d capture requests, %d duplicate requests), %d charges, 0 doubles; %d redeliveries",
		approved, stats.Captures, stats.CaptureRequests, stats.DuplicateRequests, charges, redelivered)
	t.Logf("burst: published in %s; all settled in %s: %.0f messages/s (%d stored messages over the whole run)",
		published.Round(time.Millisecond), elapsed.Round(time.Millisecond), float64(stored)/elapsed.Seconds(), stored)
}
