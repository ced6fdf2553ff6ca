package apitest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// BlackHole is a receiver on loopback that accepts every connection and
// never answers: it reads what comes until the client gives up. Accepted
// counts the connections accepted, Released those the client closed.
type BlackHole struct {
	URL      string
	Accepted atomic.Int64
	Released atomic.Int64

	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// NewBlackHole listens on a loopback port until the test ends; its
// connections are closed then, so no request waits for its timeout.
func NewBlackHole(t *testing.T) *BlackHole {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &BlackHole{URL: "http://" + ln.Addr().String(), ln: ln}
	b.wg.Go(b.accept)
	t.Cleanup(b.Close)
	return b
}

func (b *BlackHole) accept() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.Accepted.Add(1)
		b.mu.Lock()
		b.conns = append(b.conns, c)
		b.mu.Unlock()
		b.wg.Go(func() {
			_, _ = io.Copy(io.Discard, c)
			b.Released.Add(1)
		})
	}
}

// Held is how many connections are open now.
func (b *BlackHole) Held() int64 { return b.Accepted.Load() - b.Released.Load() }

// Close stops listening and closes every connection.
func (b *BlackHole) Close() {
	b.ln.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}
