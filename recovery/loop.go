package recovery

import (
	"context"
	"sync"
	"time"
)

// loop is the Start/Stop machinery the Rescuer and the Sweeper share: one
// goroutine that runs work every period until stopped.
type loop struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs work every period (first at once when immediately is true)
// until stop. Starting a running loop does nothing. It returns at once.
func (l *loop) start(ctx context.Context, every time.Duration, immediately bool, work func(context.Context)) {
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

// stop ends the loop and waits for the work in flight.
func (l *loop) stop() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}
