package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/wire"
)

// gatedAcquirer holds every capture of tokHold until gate is closed.
type gatedAcquirer struct {
	chargeonce.Acquirer
	gate chan struct{}
}

const tokHold = "tok_hold"

func (g gatedAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	if req.PaymentToken == tokHold {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return chargeonce.CaptureResult{}, ctx.Err()
		}
	}
	return g.Acquirer.Capture(ctx, req)
}

// TestOutboxReleaseKeepsNotify (issue 18.5): an attempt (HTTP's, here its
// engine) inserts a key and waits for an acquirer slot; the queue message
// for the same intent reaches its last delivery, so the worker flags the
// record for the outbox and acks. The attempt is then shed and releases the
// record. The client's retry must still get its answer published: the
// release keeps the flagged record, and the retry's completion writes the
// outbox row. On both stores.
func TestOutboxReleaseKeepsNotify(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			store := apitest.Store(t, kind)
			js := natstest.JetStream(t, natstest.Start(t).URL)
			if err := queue.EnsureStreams(t.Context(), js, queue.StreamOptions{}); err != nil {
				t.Fatal(err)
			}
			acq := gatedAcquirer{Acquirer: apitest.Simulator(t, acquirer.Options{}), gate: make(chan struct{})}
			opts := engineOpts
			opts.MaxInFlight, opts.MerchantMaxInFlight, opts.AdmissionWait = 1, 1, time.Minute
			opts.AcquirerTimeout = time.Minute
			eng := engine.New(store, acq, opts)

			// The one slot is busy.
			blocker := make(chan error, 1)
			holdReq := decode(t, body(60, tokHold))
			go func() {
				_, err := eng.Charge(context.Background(), merchant, "blocker", &holdReq)
				blocker <- err
			}()
			apitest.Eventually(t, 10*time.Second, "the blocker to hold the slot", func() bool {
				rec, err := store.KeyGet(t.Context(), merchant, "blocker")
				return err == nil && rec.State == chargeonce.KeyProcessing
			})
			time.Sleep(100 * time.Millisecond) // from its insert to its slot
			// The attempt: inserted, waiting for a slot.
			client, hangUp := context.WithCancel(t.Context())
			shed := make(chan error, 1)
			shedReq := decode(t, body(61, "tok_ok"))
			go func() {
				_, err := eng.Charge(client, merchant, "shed", &shedReq)
				shed <- err
			}()
			apitest.Eventually(t, 10*time.Second, "the attempt's record", func() bool {
				rec, err := store.KeyGet(t.Context(), merchant, "shed")
				return err == nil && rec.State == chargeonce.KeyProcessing
			})

			// The queue message for the same intent, at its last delivery.
			w := queue.NewWorker(js, engine.New(store, acq, engineOpts), store, queue.WorkerOptions{MaxDeliver: 1})
			if err := w.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Stop)
			m := nats.NewMsg(queue.RequestSubject(merchant))
			m.Header.Set(queue.HeaderIdempotencyKey, "shed")
			m.Data = []byte(body(61, "tok_ok"))
			if _, err := js.PublishMsg(t.Context(), m); err != nil {
				t.Fatal(err)
			}
			consumerDrained(t, js, queue.DefaultDurable, 20*time.Second)

			// The attempt gives up waiting: the record is released.
			hangUp()
			if err := <-shed; err == nil {
				t.Fatal("the waiting attempt was not shed")
			}
			close(acq.gate)
			if err := <-blocker; err != nil {
				t.Fatal(err)
			}

			// The client's retry.
			req := decode(t, body(61, "tok_ok"))
			resp, err := eng.Charge(t.Context(), merchant, "shed", &req)
			if err != nil || resp.Status != 201 {
				t.Fatalf("retry: %+v, %v; want 201", resp, err)
			}
			p := queue.NewPublisher(store, js, queue.PublisherOptions{})
			if _, err := p.RunOnce(t.Context()); err != nil {
				t.Fatal(err)
			}
			var results []stored
			for _, r := range messages(t, js, queue.ResultSubject(merchant)) {
				if r.key() == "shed" {
					results = append(results, r)
				}
			}
			if len(results) != 1 || results[0].status() != "201" || string(results[0].body) != string(resp.Body) {
				t.Fatalf("results for the acked message: %d %v; want the retry's 201 published once", len(results), results)
			}
		})
	}
}

func decode(t *testing.T, b string) chargeonce.ChargeRequest {
	t.Helper()
	req, err := wire.DecodeChargeRequest([]byte(b))
	if err != nil {
		t.Fatal(err)
	}
	return req
}
