// Package natstest runs NATS servers with JetStream for tests: one server,
// or a cluster of several, each a nats-server process on loopback ports with
// its store in the test's TempDir, stopped when the test ends. Tests never
// depend on a NATS that happens to run on the machine.
//
// The servers are processes, not in the test's own process: nats-server's
// JetStream has data races of its own that the race detector reports (for
// example nats-io/nats-server#7288), and a report in a server goroutine fails
// whichever of our tests runs beside it. The binary is built once from the
// module's own nats-server (a tool in go.mod), without -race.
package natstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readyTimeout bounds how long a server (or a cluster's JetStream) may
// take to come up. Generous: the machine is shared.
const readyTimeout = 30 * time.Second

// serverModule is the module path of nats-server, a tool in go.mod.
const serverModule = "github.com/nats-io/nats-server/v2"

// Server is one running nats-server process.
type Server struct {
	// URL is its client URL (nats://127.0.0.1:port).
	URL string

	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// Name is the server's name (its -n flag).
func (s *Server) Name() string { return s.name }

// Shutdown stops the server as its operator would (SIGTERM: clients
// disconnected, stores flushed) and waits for it to exit; after 10 s it is
// killed.
func (s *Server) Shutdown() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
	}
}

var built struct {
	once sync.Once
	path string
	err  error
}

// binary builds nats-server once per test process into a directory keyed by
// the module's version, shared by every package's tests on the machine.
func binary() (string, error) {
	built.once.Do(func() {
		version, err := exec.CommandContext(context.Background(), "go", "list", "-m", "-f", "{{.Version}}", serverModule).Output()
		if err != nil {
			built.err = fmt.Errorf("natstest: finding the nats-server version in go.mod: %w", err)
			return
		}
		dir := filepath.Join(os.TempDir(), "chargeonce-natstest-"+strings.TrimSpace(string(version)))
		path := filepath.Join(dir, "nats-server")
		if _, err := os.Stat(path); err == nil {
			built.path = path
			return
		}
		if err := os.MkdirAll(dir, 0o750); err != nil {
			built.err = fmt.Errorf("natstest: %w", err)
			return
		}
		// Built beside and renamed into place, so a concurrent build by another
		// package's tests never leaves a half-written binary at path.
		tmp := fmt.Sprintf("%s.%d", path, os.Getpid())
		out, err := exec.CommandContext(context.Background(), "go", "build", "-o", tmp, serverModule).CombinedOutput() //nolint:gosec // G204: tmp is our own path under TempDir
		if err != nil {
			built.err = fmt.Errorf("natstest: building nats-server: %w\n%s", err, out)
			return
		}
		if err := os.Rename(tmp, path); err != nil {
			built.err = fmt.Errorf("natstest: %w", err)
			return
		}
		built.path = path
	})
	return built.path, built.err
}

// Start runs one JetStream server, stopped at cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, "n", "-js", "-sd", t.TempDir())
}

// StartWithoutJetStream runs one server with JetStream off, as a NATS server
// started without -js is, stopped at cleanup.
func StartWithoutJetStream(t testing.TB) *Server {
	t.Helper()
	return start(t, "n")
}

// start runs nats-server named name on a port of its choosing with the
// extra flags, and waits until it accepts connections.
func start(t testing.TB, name string, flags ...string) *Server {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &Server{name: name, log: filepath.Join(dir, "nats-server.log"), done: make(chan struct{})}
	args := append([]string{"-a", "127.0.0.1", "-p", "-1", "-n", name, "-l", s.log, "--ports_file_dir", dir}, flags...)
	s.cmd = exec.Command(bin, args...) //nolint:gosec,noctx // G204: the binary is the one built above; it outlives any ctx (Shutdown ends it)
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("natstest: starting nats-server: %v", err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(s.Shutdown)
	ports := filepath.Join(dir, fmt.Sprintf("nats-server_%d.ports", s.cmd.Process.Pid))
	deadline := time.Now().Add(readyTimeout)
	for s.URL == "" {
		select {
		case <-s.done:
			t.Fatalf("natstest: nats-server %s exited: %v\n%s", name, s.cmd.ProcessState, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: nats-server %s not ready within %s\n%s", name, readyTimeout, s.logTail())
		}
		if b, err := os.ReadFile(ports); err == nil { //nolint:gosec // G304: the ports file nats-server writes in our TempDir
			var p struct {
				Nats []string `json:"nats"`
			}
			if json.Unmarshal(b, &p) == nil && len(p.Nats) > 0 {
				s.URL = p.Nats[0]
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	nc, err := nats.Connect(s.URL, nats.Timeout(readyTimeout))
	if err != nil {
		t.Fatalf("natstest: connecting to nats-server %s: %v\n%s", name, err, s.logTail())
	}
	nc.Close()
	return s
}

// logTail is the end of the server's log, for a failure message.
func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.log) //nolint:gosec // G304: the log path is our own, under TempDir
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(bytes.TrimSpace(b))
}

// Cluster is a JetStream cluster of server processes.
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
		c.Servers = append(c.Servers, start(t, fmt.Sprintf("%s-n%d", name, i),
			"-js", "-sd", t.TempDir(), "--cluster_name", name,
			"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", ports[i]),
			"--routes", strings.Join(routes, ",")))
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

// JetStream connects to url (a Server's or a Cluster's URL) and returns its
// JetStream context; the connection is closed at cleanup. It reconnects
// without limit every 100 ms, as a test that stops servers needs.
func JetStream(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("natstest: connecting to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// jsClusterNotAvailable is JetStream's "JetStream system temporarily
// unavailable" (the server's JSClusterNotAvailErr).
const jsClusterNotAvailable jetstream.ErrorCode = 10008

// createReader creates ReadAll's consumer. A cluster that has just lost a
// node answers a consumer create "no responders", "temporarily
// unavailable" or not at all until its meta group has a leader again (a
// single request was seen hanging for a minute), so each attempt is
// bounded and those answers are retried until deadline.
func createReader(js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, deadline time.Time) (jetstream.Consumer, error) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cons, err := js.CreateConsumer(ctx, stream, cfg)
		cancel()
		var apiErr *jetstream.APIError
		transient := errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) ||
			errors.As(err, &apiErr) && apiErr.ErrorCode == jsClusterNotAvailable
		if err == nil || !transient || time.Now().After(deadline) {
			return cons, err
		}
		time.Sleep(200 * time.Millisecond)
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
	// A cluster that has just lost a node gets a minute to answer again.
	deadline := time.Now().Add(time.Minute)
	cons, err := createReader(js, stream, jetstream.ConsumerConfig{
		FilterSubject:     subject,
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
		Replicas:          1,
	}, deadline)
	if err != nil {
		t.Fatalf("natstest: reading %s: creating a consumer: %v", subject, err)
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
			t.Fatalf("natstest: reading %s: fetching: %v", subject, err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, Message{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
			got++
		}
		err = batch.Error()
		// Until the new consumer's interest has reached the server this
		// connection is on (slow on a cluster that has just lost a node),
		// a pull request finds no responders.
		if got == 0 && errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("natstest: reading %s: a batch: %v", subject, err)
		}
		if got == 0 {
			t.Fatalf("natstest: reading %s: %d of %d messages, then nothing", subject, len(out), n)
		}
	}
	return out
}
