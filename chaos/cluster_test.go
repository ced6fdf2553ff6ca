package chaos

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// The system under test, with the settings every run shares. Short leases
// and timeouts make recovery act within a run of seconds.
const (
	serves  = 3
	workers = 2
	// window is the acquirer's idempotency window: a capture re-sent more
	// than this after the reference's first request moves money again, as
	// a real acquirer's does once it has forgotten the key (Stripe's is
	// 24 h). It is longer than any pause or delay the nemesis injects on
	// its own, and shorter than its acquirer outage, so a re-drive that
	// sends a reference without looking it up first captures twice.
	window = "5s"
)

// serviceFlags are the flags serve and worker share.
var serviceFlags = []string{
	"--lease", "2s", "--acquirer-timeout", "700ms", "--reconcile-every", "200ms",
}

// link is one network path through toxiproxy.
type link struct {
	name  string // e.g. "serve-1->postgres"
	kind  string // postgres, acquirer, http, nats
	proxy *toxiproxy.Proxy
	// addr is where the proxy listens, the same after every restart. Read
	// it, never proxy.Listen, which toxiproxy rewrites as it starts.
	addr     string
	upstream string
	tox      *toxiproxy.ApiServer

	mu     sync.Mutex
	toxics []string // names of the toxics in place
	down   bool
}

// cluster is one run's system: PostgreSQL, NATS, the acquirer, three serve
// instances and two workers, each path between them through a link.
type cluster struct {
	t   *testing.T
	dir string
	bin string

	pg      *pgtest.Server // the primary (nil with a pair until failover matters)
	pair    *pgtest.Pair   // set for long runs: a primary with a synchronous standby
	ha      *haDB          // set for the high-availability runs: Patroni on etcd (ha_test.go)
	nats    *natstest.Server
	tox     *toxiproxy.ApiServer
	links   []*link
	acq     *proc
	serves  []*proc
	workers []*proc
	// httpLinks[i] is the clients' way to serves[i].
	httpLinks []*link
	// adminURL is serve-1's admin API (the demo admin key), where the
	// operator resolves stuck refunds (operator.go).
	adminURL   string
	failedOver bool
}

// newCluster starts everything. With pair the database is a primary with a
// synchronous standby, and the instances name both (a failover needs it);
// with ha it is a Patroni cluster of three nodes, all named.
func newCluster(t *testing.T, bin string, pair, ha bool) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), bin: bin}
	c.tox = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	var hosts []string // the servers the instances reach, through links
	switch {
	case ha:
		c.ha = newHADB(t, c.tox)
		for _, n := range c.ha.nodes {
			hosts = append(hosts, n.pgAddr)
		}
	case pair:
		c.pair = pgtest.NewPair(t)
		c.pg = c.pair.Primary
		hosts = []string{c.pair.Standby.Host(), c.pair.Primary.Host()}
	default:
		c.pg = pgtest.NewServer(t)
		hosts = []string{c.pg.Host()}
	}
	c.nats = natstest.Start(t)
	t.Cleanup(func() {
		for _, l := range c.links {
			l.mu.Lock()
			l.proxy.Stop()
			l.mu.Unlock()
		}
	})

	c.acq = startProc(t, c.dir, bin, "acquirer", true, "acquirer", "--addr", "127.0.0.1:0",
		"--slow", "1s", "--latency", "10ms", "--idempotency-window", window)

	dbURL := func(name string) string {
		var via []string
		for i, h := range hosts {
			role := "postgres"
			switch {
			case ha:
				role = c.ha.nodes[i].name
			case pair:
				role = []string{"standby", "primary"}[i]
			}
			via = append(via, c.newLink(name+"->"+role, "postgres", h).addr)
		}
		u := "postgres://postgres@" + strings.Join(via, ",") + "/postgres?sslmode=disable&pool_max_conns=6&application_name=" + name
		if pair || ha {
			u += "&target_session_attrs=read-write"
		}
		return u
	}
	for i := range serves {
		name := "serve-" + strconv.Itoa(i+1)
		acqLink := c.newLink(name+"->acquirer", "acquirer", c.acq.Addr())
		port := freePort(t)
		args := append([]string{"serve", "--addr", "127.0.0.1:" + strconv.Itoa(port), "--db", dbURL(name),
			"--acquirer", "http://" + acqLink.addr}, serviceFlags...)
		if i == 0 {
			adminPort := freePort(t)
			args = append(args, "--admin-addr", "127.0.0.1:"+strconv.Itoa(adminPort))
			c.adminURL = "http://127.0.0.1:" + strconv.Itoa(adminPort)
		}
		// The first instance migrates the schema alone; the others start
		// once it listens.
		c.serves = append(c.serves, startProc(t, c.dir, bin, name, true, args...))
		c.httpLinks = append(c.httpLinks, c.newLink("clients->"+name, "http", "127.0.0.1:"+strconv.Itoa(port)))
	}
	for i := range workers {
		name := "worker-" + strconv.Itoa(i+1)
		acqLink := c.newLink(name+"->acquirer", "acquirer", c.acq.Addr())
		natsLink := c.newLink(name+"->nats", "nats", strings.TrimPrefix(c.nats.URL, "nats://"))
		args := append([]string{"worker", "--nats", "nats://" + natsLink.addr, "--db", dbURL(name),
			"--acquirer", "http://" + acqLink.addr,
			"--ack-wait", "3s", "--max-deliver", "1000", "--outbox-every", "200ms", "--concurrency", "16"}, serviceFlags...)
		c.workers = append(c.workers, startProc(t, c.dir, bin, name, false, args...))
	}
	return c
}

// newLink starts a proxy on a free loopback port to upstream.
func (c *cluster) newLink(name, kind, upstream string) *link {
	c.t.Helper()
	p := toxiproxy.NewProxy(c.tox, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		c.t.Fatalf("toxiproxy %s: %v", name, err)
	}
	l := &link{name: name, kind: kind, proxy: p, addr: p.Listen, upstream: upstream, tox: c.tox}
	c.links = append(c.links, l)
	return l
}

// addToxic puts a toxic on l; it returns the toxic's name.
func (l *link) addToxic(typ, stream string, toxicity float64, attrs string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := fmt.Sprintf("%s_%s_%d", typ, stream, len(l.toxics))
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":%g,"attributes":%s}`, name, typ, stream, toxicity, attrs)
	if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		return "", fmt.Errorf("adding %s to %s: %w", js, l.name, err)
	}
	l.toxics = append(l.toxics, name)
	return name, nil
}

// heal takes every toxic off l and brings it back up. It replaces the
// proxy rather than removing its toxics: toxiproxy's RemoveToxic can wait
// forever for a link whose connection is gone (seen: a 30-minute run's
// nemesis stuck in chainRemoveToxic), while stopping a proxy closes its
// connections and a new one starts clean on the same address.
func (l *link) heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.toxics) == 0 && !l.down {
		return nil
	}
	l.proxy.Stop()
	p := toxiproxy.NewProxy(l.tox, l.name, l.addr, l.upstream)
	if err := p.Start(); err != nil {
		return fmt.Errorf("bringing %s up: %w", l.name, err)
	}
	l.proxy, l.toxics, l.down = p, nil, false
	return nil
}

// cut takes l down: its listener closes and every connection through it
// is dropped.
func (l *link) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down {
		l.down = true
		l.proxy.Stop()
	}
}

// instances are the processes the nemesis kills and stops.
func (c *cluster) instances() []*proc { return append(append([]*proc{}, c.serves...), c.workers...) }

// httpBases are the clients' base URLs, one per serve instance.
func (c *cluster) httpBases() []string {
	out := make([]string, len(c.httpLinks))
	for i, l := range c.httpLinks {
		out[i] = "http://" + l.addr
	}
	return out
}

// processing counts the records still processing, on the primary itself.
func (c *cluster) processing(ctx context.Context) (int64, error) {
	var url string
	switch {
	case c.ha != nil:
		url = c.ha.url()
	case c.failedOver:
		url = c.pair.Standby.URL()
	default:
		url = c.pg.URL()
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int64
	err = conn.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE state = 'processing'`).Scan(&n)
	return n, err
}

// freePort asks the kernel for a free loopback port, for a serve instance
// that must come back on the same port after a kill.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitSettled waits until no record is processing, or d passes.
func (c *cluster) waitSettled(d time.Duration) (int64, error) {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := c.processing(ctx)
		cancel()
		if err == nil && n == 0 || time.Now().After(deadline) {
			return n, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
