package engine_test

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/engine"
)

// TestBackoffShape: base*2^attempts capped at max, jittered into its upper
// half, never zero and never above the cap.
func TestBackoffShape(t *testing.T) {
	t.Parallel()
	const base, maxD = 100 * time.Millisecond, time.Second
	for attempts, ms := range []int64{100, 200, 400, 800, 1000, 1000} {
		want := time.Duration(ms) * time.Millisecond
		if attempts == 5 {
			attempts = 40 // far past the cap: no overflow
		}
		for range 200 {
			d := engine.Backoff(attempts, base, maxD)
			if d < want/2 || d > want {
				t.Fatalf("Backoff(%d) = %s, want within [%s, %s]", attempts, d, want/2, want)
			}
		}
	}
}
