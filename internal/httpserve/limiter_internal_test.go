package httpserve

import (
	"io"
	"net"
	"testing"
	"time"
)

// pair returns the server's end of a new loopback connection and the
// client's, both closed at cleanup.
func pair(t *testing.T, ln net.Listener) (server, client net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return server, client
}

// sendRequest writes a request on client and waits until the server's end
// holds it unread.
func sendRequest(t *testing.T, server, client net.Conn) {
	t.Helper()
	if _, err := io.WriteString(client, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !unread(server) {
		if time.Now().After(deadline) {
			t.Fatal("the request never showed as unread on the server's end")
		}
		time.Sleep(time.Millisecond)
	}
}

// A connection whose request has arrived but not been read yet, past the
// eviction grace (a loaded machine: the health check's connection in
// TestSlowBodiesNeverStopHealthz, 1 run in about 40), is not evicted for a
// newcomer: another idle connection with nothing unread is, and when there
// is none the newcomer is refused (503, Retry-After) rather than a sent
// request dropped unanswered.
func TestEvictionSkipsConnectionsWithARequestWaiting(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := NewLimiter(2)
	waiting, waitingClient := pair(t, ln)
	quiet, _ := pair(t, ln)
	for _, c := range []net.Conn{waiting, quiet} {
		if admitted, victim := l.admit(c); admitted != c || victim != nil {
			t.Fatalf("admit under the cap = %v, %v", admitted, victim)
		}
	}
	sendRequest(t, waiting, waitingClient) // the longest idle, with a request
	time.Sleep(evictGrace + 50*time.Millisecond)

	newcomer, newcomerClient := pair(t, ln)
	admitted, victim := l.admit(newcomer)
	if admitted != newcomer || victim != quiet {
		t.Fatalf("admit at the cap evicted %v (waiting %v, quiet %v); want the quiet connection", victim, waiting, quiet)
	}

	sendRequest(t, newcomer, newcomerClient)
	time.Sleep(evictGrace + 50*time.Millisecond)
	late, _ := pair(t, ln)
	if admitted, victim := l.admit(late); admitted != nil || victim != nil {
		t.Fatalf("admit with every idle connection holding a request = %v, evicting %v; want it refused", admitted, victim)
	}
	if st := l.Stats(); st.Evicted != 1 || st.Refused != 1 || st.Open != 2 {
		t.Fatalf("stats %+v; want 1 evicted, 1 refused, 2 open", st)
	}
}
