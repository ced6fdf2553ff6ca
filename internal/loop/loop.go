// Package loop is the Start/Stop machinery of chargeonce's background
// services (recovery's Rescuer and Sweeper, the queue's outbox Publisher):
// one goroutine that runs work every period until stopped.
package loop

import (
	"context"
	"sync"
	"time"
)

// Loop runs work every period on one goroutine until Stop. The zero value
// is ready to use.
type Loop struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs work every period (first at once when immediately is true)
// until Stop. Starting a running loop does nothing. It returns at once.
func (l *Loop) Start(ctx context.Context, every time.Duration, immediately bool, work func(context.Context)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done != nil {
		return
	}
	ctx, l.cancel = context.WithCancel(ctx)
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		t := time.NewTicker(every)
		defer t.Stop()
		if immediately {
			work(ctx)
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			work(ctx)
		}
	}()
}

// Stop ends the loop and waits for the work in flight.
func (l *Loop) Stop() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}
