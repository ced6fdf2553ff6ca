package webhook

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// TestScheduleSpansDisableWindow: even with the least jitter, a lone
// delivery's tries last longer than WebhookDisableAfter, so an endpoint
// that only ever fails is disabled before its delivery is given up. With
// jitter that could shorten waits by 20%, one run in five gave up first and
// the endpoint stayed enabled (TestFailingForDaysDisables flaked).
func TestScheduleSpansDisableWindow(t *testing.T) {
	for _, u := range []float64{0, 0.5, 0.999999} {
		var total time.Duration
		for _, step := range Schedule {
			d := jitter(step, u)
			if d < step || d > step+step/5 {
				t.Fatalf("jitter(%v, %v) = %v; want within [step, 1.2 step]", step, u, d)
			}
			total += d
		}
		if total < chargeonce.WebhookDisableAfter {
			t.Fatalf("u=%v: the schedule spans %v, under WebhookDisableAfter %v", u, total, chargeonce.WebhookDisableAfter)
		}
	}
}
