package queue_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/recovery"
)

// clusterIntents is how many intents TestClusterNodeKilled sends, each two
// or three times.
const clusterIntents = 400

// TestClusterNodeKilled runs the queue on a three-node JetStream cluster
// (nats-server processes, both streams and the consumer with three replicas)
// with two workers on connections of their own, and shuts down the node
// leading the request stream once a third of the burst is acked. Nothing is
// lost (every intent has a result, nothing pending or unacked) and nothing
// is doubled (one capture per approved intent, one charge per intent).
func TestClusterNodeKilled(t *testing.T) {
	t.Parallel()
	cluster := natstest.StartCluster(t, 3)
	store := apitest.PostgresStoreAt(t, pgtest.URL(t))
	e := setupOn(t, store, cluster.URL(), 3)

	for i := range 2 {
		js := natstest.JetStream(t, cluster.URL())
		eng := engine.New(store, e.acq.client(), e.opts)
		w := queue.NewWorker(js, eng, store, queue.WorkerOptions{AckWait: 5 * time.Second, MaxDeliver: 50, Logger: nil})
		if err := w.Start(t.Context()); err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
		t.Cleanup(w.Stop)
		pub := queue.NewPublisher(store, js, queue.PublisherOptions{Every: 200 * time.Millisecond})
		pub.Start(t.Context())
		t.Cleanup(pub.Stop)
		res := recovery.NewRescuer(store, eng, recovery.RescuerOptions{Every: 500 * time.Millisecond})
		res.Start(t.Context())
		t.Cleanup(res.Stop)
	}

	approved := 0
	declined := map[string]bool{}
	for i := range clusterIntents {
		token := "tok_ok"
		if i%10 == 0 {
			token = "tok_declined"
		}
		key := fmt.Sprintf("cl-%d", i)
		declined[key] = token == "tok_declined"
		if !declined[key] {
			approved++
		}
		ids := []string{"a-" + key, "b-" + key}
		if i%2 == 1 {
			ids = append(ids, "a-"+key)
		}
		for _, id := range ids {
			m := nats.NewMsg(queue.RequestSubject(merchant))
			m.Header.Set(queue.HeaderIdempotencyKey, key)
			m.Header.Set(jetstream.MsgIDHeader, id)
			m.Data = []byte(body(int64(1000+i), token))
			if _, err := e.js.PublishMsgAsync(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatal("the burst was not acknowledged within 60s")
	}
	stored := uint64(2 * clusterIntents)

	info := func() *jetstream.ConsumerInfo {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		c, err := e.js.Consumer(ctx, queue.RequestStream, queue.DefaultDurable)
		if err != nil {
			return nil
		}
		i, err := c.Info(ctx)
		if err != nil {
			return nil
		}
		return i
	}
	var before *jetstream.ConsumerInfo
	apitest.Eventually(t, 60*time.Second, "a third of the burst acked", func() bool {
		before = info()
		return before != nil && before.AckFloor.Stream >= stored/3
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	s, err := e.js.Stream(ctx, queue.RequestStream)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	leader := s.CachedInfo().Cluster.Leader
	var killed bool
	for _, srv := range cluster.Servers {
		if srv.Name() == leader {
			srv.Shutdown()
			killed = true
		}
	}
	if !killed {
		t.Fatalf("no server named %q (the stream's leader)", leader)
	}
	t.Logf("killed %s, the leader of %s, with %d of %d messages acked", leader, queue.RequestStream, before.AckFloor.Stream, stored)

	deadline := time.Now().Add(90 * time.Second)
	for {
		i := info()
		var processing, outbox int
		if err := store.Pool().QueryRow(t.Context(), `SELECT (SELECT count(*) FROM idempotency_keys WHERE state = 'processing'), (SELECT count(*) FROM outbox)`).Scan(&processing, &outbox); err != nil {
			t.Fatal(err)
		}
		if i != nil && i.NumPending == 0 && i.NumAckPending == 0 && i.NumRedelivered == 0 && processing == 0 && outbox == 0 {
			t.Logf("consumer: %d deliveries of %d messages", i.Delivered.Consumer, i.Delivered.Stream)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained within 90s: consumer %+v, %d processing, %d in the outbox", i, processing, outbox)
		}
		time.Sleep(200 * time.Millisecond)
	}

	g := byKey(messages(t, e.js, queue.ResultSubject(merchant)))
	for key, dec := range declined {
		rs := g[key]
		want := "201"
		if dec {
			want = "402"
		}
		if len(rs) == 0 {
			t.Fatalf("%s: no result", key)
		}
		for _, r := range rs {
			if r.status() != want || !bytes.Equal(r.body, rs[0].body) {
				t.Fatalf("%s: results differ or are not %s", key, want)
			}
		}
	}
	var charges, doubled int
	if err := store.Pool().QueryRow(context.Background(), `
SELECT (SELECT count(*) FROM charges),
       (SELECT count(*) FROM (SELECT order_id FROM charges GROUP BY order_id HAVING count(*) > 1) d)`).Scan(&charges, &doubled); err != nil {
		t.Fatal(err)
	}
	st := e.acq.sim.Stats()
	if charges != clusterIntents || doubled != 0 || st.Captures != int64(approved) {
		t.Fatalf("%d charges for %d intents, %d doubled, %d captures for %d approved", charges, clusterIntents, doubled, st.Captures, approved)
	}
	t.Logf("cluster: %d intents, %d results (%d keys), %d captures for %d approved, 0 doubles", clusterIntents, len(g), len(g), st.Captures, approved)
}
