package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/queue"
)

// TestWorkerAndPublish runs the README's queue example: a worker on an
// embedded database and its in-process acquirer, and `publish` sending one
// request and printing its result; again with the same key, the stored
// answer replayed; a declined card exits 2, an invalid request 1.
func TestWorkerAndPublish(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	db := "sqlite:" + filepath.Join(t.TempDir(), "q.db")

	ctx, cancel := context.WithCancel(context.Background())
	var werr apitest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, []string{"worker", "--nats", ns.URL, "--db", db, "--outbox-every", "100ms", "--metrics-addr", "127.0.0.1:0"}, &apitest.Buffer{}, &werr)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(werr.String(), "chargeonce worker consuming") {
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not start:\n%s", werr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	run := func(args ...string) (string, error) {
		var out, errb apitest.Buffer
		err := Main(context.Background(), append([]string{"publish", "--nats", ns.URL, "--timeout", "20s"}, args...), &out, &errb)
		return out.String(), err
	}
	out, err := run("--order", "123", "--amount", "25000", "--key", "order-123")
	if err != nil || !strings.HasPrefix(out, "Status: 201\nIdempotency-Key: order-123\n\n{\"id\":\"ch_") || !strings.Contains(out, `"status":"captured"`) {
		t.Fatalf("publish: %v\n%s", err, out)
	}
	again, err := run("--order", "123", "--amount", "25000", "--key", "order-123")
	body := out[strings.Index(out, "\n\n"):]
	if err != nil || !strings.Contains(again, "Idempotent-Replayed: true") || !strings.HasSuffix(again, body) {
		t.Fatalf("publish again: %v\n%s\nwant the first body %s", err, again, body)
	}
	// Its message ids are scoped by merchant (JetStream dedupes them
	// across the stream), and a new sending is a new id.
	js := natstest.JetStream(t, ns.URL)
	sent := natstest.ReadAll(t, js, queue.RequestStream, queue.RequestSubject("demo"))
	if len(sent) != 2 || sent[0].Header.Get(jetstream.MsgIDHeader) == sent[1].Header.Get(jetstream.MsgIDHeader) {
		t.Fatalf("publish sent %d messages, want 2 with two ids", len(sent))
	}
	for _, m := range sent {
		if id := m.Header.Get(jetstream.MsgIDHeader); !strings.HasPrefix(id, "demo:order-123:") {
			t.Fatalf("publish's Nats-Msg-Id %q, want demo:order-123:<send>", id)
		}
	}
	// A refund of the charge over the queue, and one past what remains.
	chargeID := regexp.MustCompile(`"id":"(ch_[^"]+)"`).FindStringSubmatch(out)
	if chargeID == nil {
		t.Fatalf("no charge id in %s", out)
	}
	refund, err := run("--refund-of", chargeID[1], "--amount", "10000", "--reason", "requested_by_customer", "--key", "refund-1")
	if err != nil || !strings.HasPrefix(refund, "Status: 201\nIdempotency-Key: refund-1\n\n{\"id\":\"re_") || !strings.Contains(refund, `"status":"succeeded"`) {
		t.Fatalf("publish --refund-of: %v\n%s", err, refund)
	}
	refund, err = run("--refund-of", chargeID[1], "--amount", "20000", "--key", "refund-2")
	if ec := exitCodeError(0); !errors.As(err, &ec) || ec != 1 || !strings.HasPrefix(refund, "Status: 400") || !strings.Contains(refund, "remaining amount_cents is 15000") {
		t.Fatalf("a refund past what remains: %v\n%s", err, refund)
	}
	out, err = run("--order", "124", "--amount", "100", "--token", "tok_declined")
	if ec := exitCodeError(0); !errors.As(err, &ec) || ec != 2 || !strings.HasPrefix(out, "Status: 402") {
		t.Fatalf("declined: %v\n%s", err, out)
	}
	out, err = run("--order", "125", "--amount", "100", "--currency", "us", "--key", "bad-currency")
	if ec := exitCodeError(0); !errors.As(err, &ec) || ec != 1 || !strings.HasPrefix(out, "Status: 400") || !strings.Contains(out, `"field":"currency"`) {
		t.Fatalf("invalid currency: %v\n%s", err, out)
	}

	// The worker's metrics count what happened.
	m := regexp.MustCompile(`msg="metrics listening" addr=(\S+)`).FindStringSubmatch(werr.String())
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", werr.String())
	}
	// The worker counts a message once it has acked or terminated it, which
	// can come a moment after publish has printed its result.
	wants := []string{
		`chargeonce_queue_messages_total{outcome="answered"} 3`,
		`chargeonce_queue_messages_total{outcome="refused"} 1`,
		`chargeonce_queue_messages_total{outcome="replayed"} 1`,
		`chargeonce_queue_messages_total{outcome="poison"} 1`,
		`chargeonce_queue_dead_letters_total{reason="validation-failed"} 1`,
		`chargeonce_outbox_depth 0`,
	}
	var missing []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + m[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		missing = missing[:0]
		for _, want := range wants {
			if !strings.Contains(string(text), want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range missing {
		t.Errorf("/metrics lacks %s", want)
	}
}

func TestWorkerAndPublishBadConfiguration(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "c.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--db", db, "--max-deliver", "0"}, "--max-deliver"},
		{[]string{"worker", "--db", db, "--ack-wait", "1s"}, "--ack-wait"},
		{[]string{"worker", "--db", db, "--replicas", "-1"}, "--replicas"},
		{[]string{"worker", "--db", db, "--merchant-concurrency", "-1"}, "--merchant-concurrency"},
		{[]string{"worker", "--db", db, "--concurrency", "4", "--merchant-concurrency", "5"}, "--merchant-concurrency"},
		{[]string{"worker", "--db", db, "--nats", "nats://127.0.0.1:1"}, "--nats"},
		{[]string{"publish", "--amount", "5"}, "--order"},
		{[]string{"publish", "--order", "5"}, "--amount"},
		{[]string{"publish", "--order", "5", "--amount", "5", "--nats", "nats://127.0.0.1:1"}, "--nats"},
		{[]string{"publish", "--order", "5", "--amount", "5", "--nats", "nats://127.0.0.1:1", "--merchant", "a.b"}, "--merchant"},
		{[]string{"publish", "--order", "5", "--amount", "5", "--nats", "nats://127.0.0.1:1", "--merchant", "caf\u00e9"}, "--merchant"},
	} {
		var out, errb apitest.Buffer
		err := Main(context.Background(), tc.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to name %s", tc.args, err, tc.want)
		}
	}
}

// TestWorkerStreamsOnClusterR3 (issue 18.9): on a JetStream cluster the
// worker creates both streams with three replicas and file storage without
// being told (--replicas 0, the default, detects the deployment).
func TestWorkerStreamsOnClusterR3(t *testing.T) {
	t.Parallel()
	cluster := natstest.StartCluster(t, 3)
	db := "sqlite:" + filepath.Join(t.TempDir(), "q.db")
	ctx, cancel := context.WithCancel(context.Background())
	var werr apitest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, []string{"worker", "--nats", cluster.URL(), "--db", db}, &apitest.Buffer{}, &werr)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	apitest.Eventually(t, 30*time.Second, "the worker to start", func() bool {
		return strings.Contains(werr.String(), "chargeonce worker consuming")
	})
	js := natstest.JetStream(t, cluster.URL())
	for _, name := range []string{queue.RequestStream, queue.ResultStream} {
		s, err := js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.Replicas != 3 || c.Storage != jetstream.FileStorage {
			t.Fatalf("%s: %d replicas, storage %s; want 3 on file", name, c.Replicas, c.Storage)
		}
	}
}

// A NATS server without JetStream is a configuration mistake the worker
// and publish name, with what to do about it.
func TestWorkerAndPublishWithoutJetStream(t *testing.T) {
	t.Parallel()
	nats := natstest.StartWithoutJetStream(t)
	db := "sqlite:" + filepath.Join(t.TempDir(), "c.db")
	for _, args := range [][]string{
		{"worker", "--db", db, "--nats", nats.URL},
		{"publish", "--order", "5", "--amount", "5", "--nats", nats.URL, "--timeout", "5s"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var out, errb apitest.Buffer
		err := Main(ctx, args, &out, &errb)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "JetStream") || !strings.Contains(err.Error(), "-js") {
			t.Errorf("%s against a server without JetStream: err = %v; want it to say to enable JetStream (-js)", args[0], err)
		}
	}
}
