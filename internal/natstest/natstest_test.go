package natstest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce/internal/natstest"
)

// TestReadAllAfterANodeStops: ReadAll reads a replicated stream whole at
// once after a cluster node stops, as tests that stop a node do next. Each
// round stops a different node of a fresh cluster, so one of them stops the
// meta leader. A single consumer create was seen to hang for a minute there,
// and a pull request to find no responders (2 of 10 runs under load).
func TestReadAllAfterANodeStops(t *testing.T) {
	t.Parallel()
	const sent = 10
	for i := range 3 {
		c := natstest.StartCluster(t, 3)
		js := natstest.JetStream(t, c.URL())
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3}); err != nil {
			cancel()
			t.Fatal(err)
		}
		for j := range sent {
			if _, err := js.Publish(ctx, fmt.Sprintf("s.%d", j), []byte("m")); err != nil {
				cancel()
				t.Fatal(err)
			}
		}
		cancel()
		c.Servers[i].Shutdown()
		if got := natstest.ReadAll(t, js, "S", "s.>"); len(got) != sent {
			t.Fatalf("stopped %s: read %d messages, want %d", c.Servers[i].Name(), len(got), sent)
		}
	}
}
