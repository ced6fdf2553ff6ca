// Package natstest runs NATS servers with JetStream inside the test
// process: one server, or a cluster of several, each on free loopback ports
// with its store in the test's TempDir, shut down when the test ends. Tests
// never depend on a NATS that happens to run on the machine.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readyTimeout bounds how long a server (or a cluster's JetStream) may
// take to come up. Generous: the machine is shared.
const readyTimeout = 30 * time.Second

// Server is one running server.
type Server struct {
	*server.Server
	// URL is its client URL (nats://127.0.0.1:port).
	URL string
}

// Start runs one JetStream server, shut down at cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	})
}

func start(t testing.TB, opts *server.Options) *Server {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: starting nats-server: %v", err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(readyTimeout) {
		t.Fatalf("natstest: nats-server %s not ready within %s", opts.ServerName, readyTimeout)
	}
	return &Server{Server: s, URL: s.ClientURL()}
}

// Cluster is a JetStream cluster of in-process servers.
type Cluster struct {
	Servers []*Server
}

// URL lists every server's client URL, comma-separated, as nats.Connect
// takes them.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		urls[i] = s.URL
	}
	return strings.Join(urls, ",")
}

// StartCluster runs a JetStream cluster of n servers and waits until it has
// a meta leader, so streams with n replicas can be created.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	name := fmt.Sprintf("c%d", time.Now().UnixNano()%1e6)
	c := &Cluster{}
	for i := range n {
		c.Servers = append(c.Servers, start(t, &server.Options{
			ServerName: fmt.Sprintf("%s-n%d", name, i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: ports[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}))
	}
	nc, err := nats.Connect(c.URL())
	if err != nil {
		t.Fatalf("natstest: connecting to the cluster: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: the cluster's JetStream is not ready within %s: %v", readyTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Message is a message read back from a stream.
type Message struct {
	Subject string
	Header  nats.Header
	Data    []byte
}

// maxReadAll bounds what ReadAll holds in memory: far more than a test sends.
const maxReadAll = 1 << 20

// ReadAll returns every message of stream on subject (wildcards allowed),
// in stream order, through a short-lived consumer that it deletes again.
func ReadAll(t testing.TB, js jetstream.JetStream, stream, subject string) []Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cons, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		FilterSubject:     subject,
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		t.Fatalf("natstest: reading %s: %v", subject, err)
	}
	// A consumer left behind goes by itself after InactiveThreshold.
	defer func() { _ = js.DeleteConsumer(context.Background(), stream, cons.CachedInfo().Name) }()
	pending := cons.CachedInfo().NumPending
	if pending > maxReadAll {
		t.Fatalf("natstest: reading %s: %d messages, more than ReadAll reads (%d)", subject, pending, maxReadAll)
		return nil // not reached: Fatalf ends the test
	}
	n := int(pending)
	out := make([]Message, 0, n)
	for len(out) < n {
		batch, err := cons.Fetch(min(n-len(out), 500), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatalf("natstest: reading %s: %v", subject, err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, Message{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
			got++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("natstest: reading %s: %v", subject, err)
		}
		if got == 0 {
			t.Fatalf("natstest: reading %s: %d of %d messages, then nothing", subject, len(out), n)
		}
	}
	return out
}

// StartWithoutJetStream runs one server with JetStream off, as a NATS server
// started without -js is, shut down at cleanup.
func StartWithoutJetStream(t testing.TB) *Server {
	t.Helper()
	return start(t, &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
}
