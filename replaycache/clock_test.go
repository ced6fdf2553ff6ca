package replaycache_test

import (
	"context"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/replaycache"
)

// skewedSetup is setup with an instance clock that is off by skew from the
// database's, as an instance without NTP can be.
func skewedSetup(t *testing.T, skew time.Duration, kind string) fixture {
	t.Helper()
	inner := &counting{Store: apitest.Store(t, kind)}
	cache := replaycache.New(inner, replaycache.Options{SkewMargin: time.Millisecond, Now: func() time.Time { return time.Now().Add(skew) }})
	return fixture{inner: inner, cache: cache}
}

// TestExpiryFollowsTheDatabaseClockNotTheInstances: the database decides
// when a key expires. An instance whose clock runs an hour late must not
// keep replaying a record the database has expired (a reused key is a new
// intent there), and one whose clock runs an hour early must still serve a
// record the database keeps for another hour from memory.
func TestExpiryFollowsTheDatabaseClockNotTheInstances(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind+"/instance-late", func(t *testing.T) {
			t.Parallel()
			f := skewedSetup(t, -time.Hour, kind)
			ctx := context.Background()
			f.completed(t, "m", "k", time.Second, "first")
			if _, err := f.cache.KeyGet(ctx, "m", "k"); err != nil {
				t.Fatal(err)
			}
			// Wait until the record has expired by the database's clock
			// (the same machine's: only the instance's clock is skewed).
			rec, err := f.inner.Store.KeyGet(ctx, "m", "k")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(rec.ExpiresAt) + 100*time.Millisecond)
			_, inserted, err := f.cache.KeyInsert(ctx, intent("m", "k"))
			if err != nil || !inserted {
				t.Fatalf("KeyInsert of a key the database expired: inserted=%v err=%v; want a new intent, not a replay from memory", inserted, err)
			}
		})
		t.Run(kind+"/instance-early", func(t *testing.T) {
			t.Parallel()
			f := skewedSetup(t, time.Hour, kind)
			ctx := context.Background()
			f.completed(t, "m", "k", 30*time.Minute, "first")
			for range 3 {
				if _, err := f.cache.KeyGet(ctx, "m", "k"); err != nil {
					t.Fatal(err)
				}
			}
			if n := f.inner.gets.Load(); n != 1 {
				t.Fatalf("store reads %d, want 1: the record has half an hour left by the database's clock and must be served from memory", n)
			}
		})
	}
}
