package bench

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClient answers 201 after delay(n), n counting its requests, and
// tells seen about every key.
type fakeClient struct {
	n     int
	delay func(n int) time.Duration
	seen  func(key string)
}

func (c *fakeClient) charge(_ context.Context, key string, _ []byte, _ *chargeRequest) (int, bool, error) {
	c.n++
	time.Sleep(c.delay(c.n))
	if c.seen != nil {
		c.seen(key)
	}
	return 201, false, nil
}

func (c *fakeClient) close() {}

func fakeBench(newClient func() client) *bench {
	b := &bench{cfg: Config{Duration: 400 * time.Millisecond, Rounds: 2, Group: 4}, runID: "t"}
	b.ways = []*way{{name: "fake", newClient: newClient}}
	return b
}

// The numbers must describe what happened: with one slow answer in ten,
// the median is a fast one and the 99th percentile a slow one, and a closed
// loop obeys Little's law (clients = throughput × mean latency).
func TestMeasurementsAreConsistent(t *testing.T) {
	t.Parallel()
	const clients = 4
	b := fakeBench(func() client {
		return &fakeClient{delay: func(n int) time.Duration {
			if n%10 == 0 {
				return 20 * time.Millisecond
			}
			return time.Millisecond
		}}
	})
	rs, err := b.measureCell(context.Background(), WorkloadNew, clients, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.requests < 50 || r.errors != 0 {
		t.Fatalf("requests %d, errors %d", r.requests, r.errors)
	}
	if p50 := r.percentile(50); p50 < time.Millisecond || p50 >= 10*time.Millisecond {
		t.Errorf("p50 = %s, want a fast answer (1ms and up)", p50)
	}
	if p99 := r.percentile(99); p99 < 20*time.Millisecond {
		t.Errorf("p99 = %s, want a slow answer (20ms and up)", p99)
	}
	if little := r.rps() * r.mean().Seconds(); little < 0.8*clients || little > 1.05*clients {
		t.Errorf("throughput × mean latency = %.2f, want about %d clients (rps %.0f, mean %s)", little, clients, r.rps(), r.mean())
	}
}

// In the contended workload every key is sent by exactly the clients of
// one group, and no two groups share a key.
func TestContendedGroupsShareKeys(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	count := map[string]int{}
	b := fakeBench(func() client {
		return &fakeClient{delay: func(int) time.Duration { return 100 * time.Microsecond }, seen: func(k string) {
			mu.Lock()
			count[k]++
			mu.Unlock()
		}}
	})
	if _, err := b.measureCell(context.Background(), WorkloadContended, 6, 0); err != nil { // groups of 4 and 2
		t.Fatal(err)
	}
	sizes := map[int]int{}
	for k, n := range count {
		if !strings.HasPrefix(k, "ct-t-fake-") {
			t.Fatalf("key %q", k)
		}
		sizes[n]++
	}
	if len(count) < 10 || len(sizes) != 2 || sizes[4] == 0 || sizes[2] == 0 {
		t.Fatalf("keys by how many clients sent them: %v, want only 4 (the first group) and 2 (the second)", sizes)
	}
}

// Replays cycle through the seeded keys and nothing else.
func TestReplayUsesSeededKeys(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]bool{}
	b := fakeBench(func() client {
		return &fakeClient{delay: func(int) time.Duration { return 50 * time.Microsecond }, seen: func(k string) {
			mu.Lock()
			seen[k] = true
			mu.Unlock()
		}}
	})
	b.replayKeys = []string{"a", "b", "c"}
	if _, err := b.measureCell(context.Background(), WorkloadReplay, 2, 0); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 || !seen["a"] || !seen["b"] || !seen["c"] {
		t.Fatalf("keys sent: %v", seen)
	}
}

// New keys are fresh every time, 32 hex digits like a UUID.
func TestNewKeysAreFresh(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	var mu sync.Mutex
	seen := map[string]bool{}
	b := fakeBench(func() client {
		return &fakeClient{delay: func(int) time.Duration { return 50 * time.Microsecond }, seen: func(k string) {
			n.Add(1)
			mu.Lock()
			seen[k] = true
			mu.Unlock()
			if len(k) != 32 {
				t.Errorf("key %q is not 32 hex digits", k)
			}
		}}
	})
	if _, err := b.measureCell(context.Background(), WorkloadNew, 3, 0); err != nil {
		t.Fatal(err)
	}
	if int64(len(seen)) != n.Load() {
		t.Fatalf("%d keys sent, %d distinct", n.Load(), len(seen))
	}
}
