package client

import (
	"net/http"
	"testing"
	"time"
)

func TestBackoffIsFullJitterUnderACap(t *testing.T) {
	t.Parallel()
	c := New("http://127.0.0.1:1", "k", WithBackoff(100*time.Millisecond, time.Second))
	for n := 1; n <= 70; n++ {
		window := min(100*time.Millisecond<<min(n-1, 20), time.Second)
		var sawLow, sawHigh bool
		for range 200 {
			d := c.backoff(n)
			if d < 0 || d > window {
				t.Fatalf("backoff(%d) = %s, want within [0, %s]", n, d, window)
			}
			sawLow = sawLow || d < window/4
			sawHigh = sawHigh || d > window*3/4
		}
		if !sawLow || !sawHigh {
			t.Fatalf("backoff(%d) is not spread over [0, %s]", n, window)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"1", time.Second},
		{" 3 ", 3 * time.Second},
		{"0", 0},
		{"-5", 0},
		{"soon", 0},
		{now.Add(5 * time.Second).Format(http.TimeFormat), 5 * time.Second},
		{now.Add(-5 * time.Second).Format(http.TimeFormat), 0},
		{"99999999999", 24 * time.Hour},
	} {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestIdempotencyKeys(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		k := NewIdempotencyKey()
		if len(k) != 36 || k[14] != '4' || (k[19] != '8' && k[19] != '9' && k[19] != 'a' && k[19] != 'b') || checkKey(k) != nil {
			t.Fatalf("NewIdempotencyKey() = %q, not a UUIDv4", k)
		}
		if seen[k] {
			t.Fatalf("key %q made twice", k)
		}
		seen[k] = true
	}
	for key, want := range map[string]string{
		"abc-123":  "abc-123",
		`"quoted"`: `"\"quoted\""`,
		`"a\b`:     `"\"a\\b"`,
	} {
		if got := keyHeader(key); got != want {
			t.Errorf("keyHeader(%q) = %q, want %q", key, got, want)
		}
	}
}
