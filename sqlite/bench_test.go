package sqlite_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// BenchmarkKeyInsert measures the first attempt of new intents: one
// IMMEDIATE transaction with two inserts, from parallel callers queueing for
// the single writer.
func BenchmarkKeyInsert(b *testing.B) {
	s := setupB(b)
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, inserted, err := s.KeyInsert(ctx, params("m", fmt.Sprintf("k%d", i), i)); err != nil || !inserted {
				b.Fatalf("KeyInsert: inserted=%v err=%v", inserted, err)
			}
		}
	})
}

// BenchmarkKeyInsertRetry measures retries of one intent: the conflict path,
// which reads the existing record inside the write transaction.
func BenchmarkKeyInsertRetry(b *testing.B) {
	s := setupB(b)
	ctx := context.Background()
	if _, _, err := s.KeyInsert(ctx, params("m", "k", 1)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, inserted, err := s.KeyInsert(ctx, params("m", "k", 1)); err != nil || inserted {
				b.Fatalf("KeyInsert: inserted=%v err=%v", inserted, err)
			}
		}
	})
}

// BenchmarkKeyGet measures a read through the read pool.
func BenchmarkKeyGet(b *testing.B) {
	s := setupB(b)
	ctx := context.Background()
	if _, _, err := s.KeyInsert(ctx, params("m", "k", 1)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.KeyGet(ctx, "m", "k"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
