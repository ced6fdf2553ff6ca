// Package replaycache answers replays from memory: a chargeonce.Store
// decorator that remembers completed idempotency records, so that the retry
// storm after a timeout costs no database round trip.
//
// It is safe because a completed record never changes: every statement that
// modifies a record (KeyComplete, KeyLeaseSet, KeyClaim, KeysClaimExpired,
// KeyRelease) requires it to be processing, so once completed the record,
// its fingerprint and its stored response stay exactly as they are until
// the record expires and is deleted (by the sweeper, or by KeyInsert when
// the key is reused after expiry). The cache therefore
//
//   - keeps only completed records, and only ones it read from the store,
//     never ones it was told about: what it serves is what the database
//     holds;
//   - keys entries by (merchant, key), so that one merchant can never be
//     answered with another's record;
//   - serves an entry only for the time the record had left when it was
//     read (KeyRecord.ExpiresIn, computed by the database's clock), counted
//     down on this instance's monotonic clock, less a small margin for the
//     time the answer took to arrive; from then on the store decides
//     again, and a key reused after expiry is a new intent there. The
//     instance's wall clock never decides: an instance whose clock is off
//     neither replays a record the database has expired nor stops caching
//     records the database keeps;
//   - holds a bounded number of entries, least recently used out first.
//
// A hit answers KeyInsert with the record and inserted=false, exactly as
// the store would; the engine then compares fingerprints (422 for a
// different request) and replays the stored response. Processing records
// are never cached: whether an attempt is still in progress, or its lease
// has ended, must come from the database every time.
package replaycache

import (
	"bytes"
	"container/list"
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Defaults of Options.
const (
	// DefaultMaxEntries bounds the cache. An entry holds a record and its
	// stored response, about 1 KiB, so the default costs some 10 MiB at
	// most: room for the keys of every request of the last minutes of a
	// busy instance, which is where retries come from.
	DefaultMaxEntries = 10_000
	// DefaultSkewMargin is how long before a record's expiry the cache
	// stops serving it. The time left is the database's, counted from when
	// the answer arrived, so the margin only has to cover the time between
	// the database computing it and the answer arriving (and any drift of
	// the monotonic clock); a minute is generous, and costs nothing but a
	// few extra reads in the last minute of a key's 24 hours.
	DefaultSkewMargin = time.Minute
)

// shards splits the cache so that concurrent requests rarely wait on the
// same lock.
const shards = 16

// Options configure a Store. Zero fields take the defaults above.
type Options struct {
	MaxEntries int
	SkewMargin time.Duration
	// Now is the instance's clock; tests set it. Only the differences
	// between its readings matter (time.Now carries a monotonic reading),
	// never its wall-clock value.
	Now func() time.Time
}

// Store is a chargeonce.Store that answers KeyInsert, RefundInsert and KeyGet for
// completed records from memory. Every other method goes to the store it
// wraps. It is safe for concurrent use.
type Store struct {
	chargeonce.Store
	margin time.Duration
	now    func() time.Time
	seed   maphash.Seed
	shards [shards]shard

	hits, misses atomic.Int64
}

var _ chargeonce.Store = (*Store)(nil)

type entryKey struct{ merchant, key string }

type entry struct {
	k   entryKey
	rec chargeonce.KeyRecord
	// until is when the entry stops being served: the time the record had
	// left when read, less the margin, counted from the read on c.now.
	until time.Time
}

type shard struct {
	mu  sync.Mutex
	max int
	m   map[entryKey]*list.Element
	lru list.List // front: most recently used
}

// New returns s with a replay cache in front of it.
func New(s chargeonce.Store, opts Options) *Store {
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.SkewMargin <= 0 {
		opts.SkewMargin = DefaultSkewMargin
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Store{Store: s, margin: opts.SkewMargin, now: opts.Now, seed: maphash.MakeSeed()}
	per := max(1, (opts.MaxEntries+shards-1)/shards)
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].m = make(map[entryKey]*list.Element)
	}
	return c
}

// Stats counts the cache's answers.
type Stats struct {
	Hits, Misses int64
	Entries      int
}

// Stats returns how often the cache answered and how much it holds.
func (c *Store) Stats() Stats {
	st := Stats{Hits: c.hits.Load(), Misses: c.misses.Load()}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		st.Entries += len(sh.m)
		sh.mu.Unlock()
	}
	return st
}

// KeyInsert answers from memory when the key's completed record is cached
// (inserted=false, as the store would answer), and otherwise asks the store
// and remembers a completed record it returns.
func (c *Store) KeyInsert(ctx context.Context, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	k := entryKey{p.Charge.MerchantID, p.Charge.IdempotencyKey}
	if rec, ok := c.get(k); ok {
		return rec, false, nil
	}
	read := c.now()
	rec, inserted, err := c.Store.KeyInsert(ctx, p)
	if err == nil && !inserted {
		c.put(k, rec, read)
	}
	return rec, inserted, err
}

// RefundInsert is KeyInsert for a refund's attempt: idempotency keys are
// one namespace per merchant, so a completed record cached under the key,
// a refund's or a charge's, is what the store would answer (inserted=false)
// and the engine replays it or answers 422.
func (c *Store) RefundInsert(ctx context.Context, p chargeonce.RefundInsertParams) (chargeonce.KeyRecord, bool, error) {
	k := entryKey{p.Refund.MerchantID, p.Refund.IdempotencyKey}
	if rec, ok := c.get(k); ok {
		return rec, false, nil
	}
	read := c.now()
	rec, inserted, err := c.Store.RefundInsert(ctx, p)
	if err == nil && !inserted {
		c.put(k, rec, read)
	}
	return rec, inserted, err
}

// KeyCached returns the key's completed record when it is in memory, with
// no database round trip, and false otherwise (engine.KeyCache): the
// engine's replay fast path.
func (c *Store) KeyCached(merchantID, key string) (chargeonce.KeyRecord, bool) {
	return c.get(entryKey{merchantID, key})
}

// KeyGet answers from memory when the key's completed record is cached, and
// otherwise asks the store and remembers a completed record it returns.
func (c *Store) KeyGet(ctx context.Context, merchantID, key string) (chargeonce.KeyRecord, error) {
	k := entryKey{merchantID, key}
	if rec, ok := c.get(k); ok {
		return rec, nil
	}
	read := c.now()
	rec, err := c.Store.KeyGet(ctx, merchantID, key)
	if err == nil {
		c.put(k, rec, read)
	}
	return rec, err
}

func (c *Store) shard(k entryKey) *shard {
	return &c.shards[maphash.Comparable(c.seed, k)%shards]
}

// get returns a copy of k's record while it may still be served.
func (c *Store) get(k entryKey) (chargeonce.KeyRecord, bool) {
	sh := c.shard(k)
	sh.mu.Lock()
	el, ok := sh.m[k]
	if !ok {
		sh.mu.Unlock()
		c.misses.Add(1)
		return chargeonce.KeyRecord{}, false
	}
	e := el.Value.(*entry)
	now := c.now()
	if !now.Before(e.until) {
		// Near its expiry: the store decides from now on.
		sh.lru.Remove(el)
		delete(sh.m, k)
		sh.mu.Unlock()
		c.misses.Add(1)
		return chargeonce.KeyRecord{}, false
	}
	sh.lru.MoveToFront(el)
	rec := e.rec
	sh.mu.Unlock()
	c.hits.Add(1)
	// ExpiresIn was the time left at the read; what the caller gets says
	// the time left now, as the store would.
	rec.ExpiresIn = max(e.until.Sub(now)+c.margin, 0)
	// The caller gets bytes of its own: nothing it does to them can change
	// what later replays send.
	rec.ResponseBody = bytes.Clone(rec.ResponseBody)
	return rec, true
}

// put remembers rec when it is completed and far enough from its expiry.
// read is c.now() from before the store was asked: the record had
// rec.ExpiresIn left at some instant after read, so counting from read never
// serves it past its expiry.
func (c *Store) put(k entryKey, rec chargeonce.KeyRecord, read time.Time) {
	if rec.State != chargeonce.KeyCompleted || rec.MerchantID != k.merchant || rec.Key != k.key {
		return
	}
	until := read.Add(rec.ExpiresIn - c.margin)
	if !c.now().Before(until) {
		return
	}
	rec.ResponseBody = bytes.Clone(rec.ResponseBody)
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if el, ok := sh.m[k]; ok {
		// Another request read the same record meanwhile: it is the same
		// immutable record.
		sh.lru.MoveToFront(el)
		return
	}
	sh.m[k] = sh.lru.PushFront(&entry{k: k, rec: rec, until: until})
	for len(sh.m) > sh.max {
		last := sh.lru.Back()
		sh.lru.Remove(last)
		delete(sh.m, last.Value.(*entry).k)
	}
}

// HistoryAppend passes charges' history through to the store when it keeps
// one (both stores do), so that an engine in front of the cache records its
// unusual paths; the cache holds no history.
func (c *Store) HistoryAppend(ctx context.Context, entries ...chargeonce.HistoryEntry) error {
	if h, ok := c.Store.(chargeonce.HistoryAppender); ok {
		return h.HistoryAppend(ctx, entries...)
	}
	return nil
}
