package racedemo

import (
	"context"

	"github.com/chargeonce/chargeonce"
)

// The engine is run unchanged; to see inside an attempt, its store and its
// acquirer are wrapped, and the attempt rides along in the context (the
// engine detaches its writes from the caller's cancellation with
// context.WithoutCancel, which keeps values).

type attemptKey struct{}

func withAttempt(ctx context.Context, a *Attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

func attemptFrom(ctx context.Context) *Attempt {
	a, _ := ctx.Value(attemptKey{}).(*Attempt)
	return a
}

// recordingStore times the engine's insert and its storing of the answer.
type recordingStore struct {
	chargeonce.Store
}

func (s recordingStore) KeyInsert(ctx context.Context, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	a := attemptFrom(ctx)
	if a == nil {
		return s.Store.KeyInsert(ctx, p)
	}
	from := a.now()
	rec, inserted, err := s.Store.KeyInsert(ctx, p)
	a.Insert = a.since(from)
	a.Inserted = inserted
	return rec, inserted, err
}

func (s recordingStore) KeyComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	a := attemptFrom(ctx)
	if a == nil {
		return s.Store.KeyComplete(ctx, p)
	}
	from := a.now()
	if a.Response.Valid() {
		from = a.Response.From // a retried write: one span from first try to last
	}
	err := s.Store.KeyComplete(ctx, p)
	a.Response = a.since(from)
	return err
}

// recordingAcquirer times capture calls and notes which moved money. In this
// demonstration every reference reaches the acquirer from one attempt only,
// so a captured answer is this attempt's capture.
type recordingAcquirer struct {
	acq chargeonce.Acquirer
}

func (r recordingAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	a := attemptFrom(ctx)
	if a == nil {
		return r.acq.Capture(ctx, req)
	}
	from := a.now()
	res, err := r.acq.Capture(ctx, req)
	a.Acquirer = a.since(from)
	a.Captured = err == nil && res.Status == chargeonce.StatusCaptured
	return res, err
}

// Lookup passes through: the demonstration's attempts never re-drive.
func (r recordingAcquirer) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	return r.acq.Lookup(ctx, req)
}
