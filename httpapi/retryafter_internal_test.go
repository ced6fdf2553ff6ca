package httpapi

import (
	"testing"
	"time"
)

func TestRetryAfterHeaderRoundsUpToWholeSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{time.Nanosecond, "1"},
		{300 * time.Millisecond, "1"},
		{time.Second, "1"},
		{time.Second + time.Millisecond, "2"},
		{2500 * time.Millisecond, "3"},
		{30 * time.Second, "30"},
		{5 * time.Minute, "300"},
	} {
		if got := retryAfterHeader(tc.d); got != tc.want {
			t.Errorf("retryAfterHeader(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
