package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram bounds, in microseconds: 1µs to 60s at 3 significant digits.
const (
	histMin     = 1
	histMax     = 60_000_000
	histSigFigs = 3
)

// requestTimeout bounds one request of an HTTP client, so that a wedged
// server fails the run instead of hanging it.
const requestTimeout = 30 * time.Second

// The ways a workload is run.
const (
	wayChargeonce = "chargeonce"
	wayBare       = "bare-http"
	wayRaw        = "raw-sql"
	wayMinimal    = "minimal"
	// wayWebhooks is chargeonce serving a merchant with a webhook
	// endpoint (--webhooks): every settlement writes an event and the
	// instance delivers it.
	wayWebhooks = "chargeonce+webhooks"
)

// way is one of the three ways: it makes clients.
type way struct {
	name string
	// newClient returns client i's connection (HTTP) or handle (raw SQL).
	newClient func() client
	// server is the child serving this way over HTTP; nil for raw-sql.
	server *child
	// checksFlag: the way's answers must carry Idempotent-Replayed exactly
	// when they are replays (chargeonce's do; the bare handler sends none).
	checksFlag bool
	// noReplay: the way has no stored responses to replay (the minimal
	// design keeps its own table, which the replay keys are not seeded in),
	// so the replay workload does not run it.
	noReplay bool
}

// runs reports whether the way takes part in workload.
func (w *way) runs(workload string) bool {
	return !w.noReplay || workload != WorkloadReplay
}

// client sends one charge and reports the answer's status and whether it
// was flagged as a replay. A client is used by one goroutine at a time.
type client interface {
	charge(ctx context.Context, key string, body []byte, req *chargeRequest) (status int, replayed bool, err error)
	close()
}

// httpClient speaks HTTP/1.1 over one kept-alive connection, with the least
// work a client can do (a prebuilt request, http.ReadResponse), so that the
// load generator takes as little of the machine's CPU from the servers as
// it can: all of them share two cores.
type httpClient struct {
	addr, auth string
	conn       net.Conn
	br         *bufio.Reader
	buf        []byte
}

func newHTTPClient(addr, secret string) *httpClient {
	return &httpClient{addr: addr, auth: "Bearer " + secret, buf: make([]byte, 0, 512)}
}

func (c *httpClient) charge(ctx context.Context, key string, body []byte, _ *chargeRequest) (int, bool, error) {
	return c.post(ctx, "/v1/charges", key, body)
}

// post sends one POST to path with the key and body, and reads the answer.
func (c *httpClient) post(ctx context.Context, path, key string, body []byte) (int, bool, error) {
	if c.conn == nil {
		d := net.Dialer{Timeout: 5 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", c.addr)
		if err != nil {
			return 0, false, err
		}
		c.conn, c.br = conn, bufio.NewReaderSize(conn, 4096)
	}
	b := c.buf[:0]
	b = append(b, "POST "...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.addr...)
	b = append(b, "\r\nAuthorization: "...)
	b = append(b, c.auth...)
	b = append(b, "\r\nIdempotency-Key: "...)
	b = append(b, key...)
	b = append(b, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	c.buf = b
	_ = c.conn.SetDeadline(time.Now().Add(requestTimeout))
	if _, err := c.conn.Write(b); err != nil {
		c.close()
		return 0, false, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.close()
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		c.close()
		return 0, false, err
	}
	if resp.Close {
		c.close()
	}
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", nil
}

func (c *httpClient) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.br = nil, nil
	}
}

// rawClient runs the statements in this process.
type rawClient struct{ core core }

func (c rawClient) charge(ctx context.Context, key string, _ []byte, req *chargeRequest) (int, bool, error) {
	status, _, err := c.core.charge(ctx, key, req)
	return status, false, err
}

func (rawClient) close() {}

// result is one way's measurement of one workload at one concurrency.
type result struct {
	workload string
	clients  int
	way      string
	requests int64
	errors   int64
	firstErr string
	elapsed  time.Duration
	hist     *hdrhistogram.Histogram
	// cost is what the measured slices cost the database and the server.
	cost cost
}

func (r *result) rps() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.requests) / r.elapsed.Seconds()
}

// percentile returns the latency at percentile p (0 to 100).
func (r *result) percentile(p float64) time.Duration {
	if r.hist == nil || r.hist.TotalCount() == 0 {
		return 0
	}
	return time.Duration(r.hist.ValueAtPercentile(p)) * time.Microsecond
}

// mean returns the mean latency.
func (r *result) mean() time.Duration {
	if r.hist == nil || r.hist.TotalCount() == 0 {
		return 0
	}
	return time.Duration(r.hist.Mean() * float64(time.Microsecond))
}

// source hands client i its next key and request; ok=false ends the
// client's slice.
type source interface {
	next(i int) (key string, body []byte, req *chargeRequest, ok bool)
}

// accepts reports whether an answer is the right one for the workload:
// anything else counts as an error. chargeonce's answers are also checked
// for the replay flag, which the bare handler does not send.
func accepts(workload string, checkFlag bool, status int, replayed bool) bool {
	switch workload {
	case WorkloadNew:
		return status == http.StatusCreated && (!checkFlag || !replayed)
	case WorkloadReplay:
		return status == http.StatusCreated && (!checkFlag || replayed)
	default: // contended: one winner creates, the others replay or get 409
		return status == http.StatusCreated || status == http.StatusConflict
	}
}

// slice runs c clients of w until d has passed (closed loop) and adds
// what they did to res when res is not nil.
func (b *bench) slice(ctx context.Context, workload string, w *way, clients []client, hists []*hdrhistogram.Histogram, d time.Duration, res *result) error {
	n := len(clients)
	var (
		wg       sync.WaitGroup
		requests atomic.Int64
		errs     atomic.Int64
		errMu    sync.Mutex
		firstErr string
	)
	var before costSample
	if res != nil {
		before = b.sampleCost(ctx, w)
	}
	// The slice's deadline starts after the cost sample, which can take a
	// while on a loaded machine (it queries PostgreSQL and reads /proc): a
	// deadline set before it left slices with no time at all.
	start := time.Now()
	src := b.newSource(workload, w.name, n, start.Add(d))
	for i := range n {
		wg.Go(func() {
			cl := clients[i]
			for {
				key, body, req, ok := src.next(i)
				if !ok || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				status, replayed, err := cl.charge(ctx, key, body, req)
				lat := time.Since(t0)
				if err == nil && accepts(workload, w.checksFlag, status, replayed) {
					requests.Add(1)
					if res != nil {
						_ = hists[i].RecordValue(min(max(lat.Microseconds(), histMin), histMax))
					}
					continue
				}
				errs.Add(1)
				errMu.Lock()
				if firstErr == "" {
					if err != nil {
						firstErr = err.Error()
					} else {
						firstErr = fmt.Sprintf("status %d (replayed=%v)", status, replayed)
					}
				}
				errMu.Unlock()
				if err != nil {
					// A transport error: do not spin on a dead server.
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if w.name == wayWebhooks {
		// The way's deliveries are its cost: they finish inside its time,
		// not in the next way's slice.
		if err := b.drainWebhooks(ctx, workload, n, time.Since(start), res != nil); err != nil {
			return err
		}
	}
	if res != nil {
		res.elapsed += time.Since(start)
		after := b.sampleCost(ctx, w)
		res.cost.add(before, after, after.pgCPU > 0, w.server != nil)
		res.requests += requests.Load()
		res.errors += errs.Load()
		if res.firstErr == "" {
			res.firstErr = firstErr
		}
	}
	return ctx.Err()
}

// newSource returns the key source of one slice.
func (b *bench) newSource(workload, wayName string, clients int, deadline time.Time) source {
	switch workload {
	case WorkloadNew:
		s := &newSource{deadline: deadline, bufs: make([]newBuf, clients), orders: &b.orders}
		for i := range s.bufs {
			var seed [32]byte
			copy(seed[:], randHex(16))
			s.bufs[i].rng = rand.NewChaCha8(seed)
		}
		return s
	case WorkloadReplay:
		return &replaySource{deadline: deadline, keys: b.replayKeys, cursor: make([]int, clients), body: replayBody(), req: replayRequest()}
	default:
		b.slices++
		return newContendedSource(fmt.Sprintf("ct-%s-%s-%d-", b.runID, wayName, b.slices), clients, b.cfg.Group, deadline)
	}
}

// newSource gives every request a fresh random key, shaped like the UUIDs
// real clients send (32 hex digits), so inserts land all over the index as
// they do in production, and a fresh order id.
type newSource struct {
	deadline time.Time
	bufs     []newBuf
	orders   *atomic.Int64
}

type newBuf struct {
	rng  *rand.ChaCha8
	body []byte
	req  chargeRequest
	_    [64]byte // keeps clients' buffers off each other's cache lines
}

func (s *newSource) next(i int) (string, []byte, *chargeRequest, bool) {
	if !time.Now().Before(s.deadline) {
		return "", nil, nil, false
	}
	nb := &s.bufs[i]
	var raw [16]byte
	binary.LittleEndian.PutUint64(raw[:8], nb.rng.Uint64())
	binary.LittleEndian.PutUint64(raw[8:], nb.rng.Uint64())
	key := hex.EncodeToString(raw[:])
	nb.req = chargeRequest{OrderID: s.orders.Add(1), AmountCents: benchAmount, Currency: benchCurrency, PaymentToken: benchToken}
	nb.body = appendBody(nb.body[:0], &nb.req)
	return key, nb.body, &nb.req, true
}

// appendBody renders a request body as a client would send it.
func appendBody(b []byte, r *chargeRequest) []byte {
	b = append(b, `{"order_id":`...)
	b = strconv.AppendInt(b, r.OrderID, 10)
	b = append(b, `,"amount_cents":`...)
	b = strconv.AppendInt(b, r.AmountCents, 10)
	b = append(b, `,"currency":"`...)
	b = append(b, r.Currency...)
	b = append(b, `","payment_token":"`...)
	b = append(b, r.PaymentToken...)
	return append(b, `"}`...)
}

func replayRequest() *chargeRequest {
	return &chargeRequest{OrderID: replayOrderID, AmountCents: benchAmount, Currency: benchCurrency, PaymentToken: benchToken}
}

func replayBody() []byte { return appendBody(nil, replayRequest()) }

// replaySource cycles each client through the completed keys, each client
// starting at its own offset.
type replaySource struct {
	deadline time.Time
	keys     []string
	cursor   []int
	body     []byte
	req      *chargeRequest
}

func (s *replaySource) next(i int) (string, []byte, *chargeRequest, bool) {
	if !time.Now().Before(s.deadline) {
		return "", nil, nil, false
	}
	if s.cursor[i] == 0 {
		s.cursor[i] = 1 + i*len(s.keys)/len(s.cursor)
	}
	k := s.keys[s.cursor[i]%len(s.keys)]
	s.cursor[i]++
	return k, s.body, s.req, true
}

// contendedSource splits the clients into groups of at most size; the
// clients of a group send the same key at once, wait until all of them
// have their answer, and go on to the next key together.
type contendedSource struct {
	prefix string
	groups []*barrier
	group  []int // client → group
	body   []byte
	req    *chargeRequest
}

func newContendedSource(prefix string, clients, size int, deadline time.Time) *contendedSource {
	s := &contendedSource{prefix: prefix, group: make([]int, clients), req: &chargeRequest{OrderID: 7, AmountCents: benchAmount, Currency: benchCurrency, PaymentToken: benchToken}}
	s.body = appendBody(nil, s.req)
	for first := 0; first < clients; first += size {
		n := min(size, clients-first)
		g := len(s.groups)
		s.groups = append(s.groups, &barrier{n: n, deadline: deadline, ch: make(chan struct{})})
		for i := first; i < first+n; i++ {
			s.group[i] = g
		}
	}
	return s
}

func (s *contendedSource) next(i int) (string, []byte, *chargeRequest, bool) {
	g := s.group[i]
	round, ok := s.groups[g].wait()
	if !ok {
		return "", nil, nil, false
	}
	return s.prefix + strconv.Itoa(g) + "-" + strconv.FormatInt(round, 10), s.body, s.req, true
}

// barrier is a cyclic barrier for one group. The last client to arrive
// opens the next round, or ends the group's slice once the deadline has
// passed, so that all of the group's clients stop together and none waits
// for a partner that has left.
type barrier struct {
	mu       sync.Mutex
	n        int
	arrived  int
	round    int64
	stop     bool
	deadline time.Time
	ch       chan struct{}
}

func (b *barrier) wait() (round int64, ok bool) {
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.n {
		b.arrived = 0
		b.round++
		b.stop = !time.Now().Before(b.deadline)
		close(b.ch)
		b.ch = make(chan struct{})
		round, stop := b.round, b.stop
		b.mu.Unlock()
		return round, !stop
	}
	ch := b.ch
	b.mu.Unlock()
	<-ch
	b.mu.Lock()
	defer b.mu.Unlock()
	// Nobody can open another round until this client arrives again.
	return b.round, !b.stop
}

// measureCell runs one workload at one concurrency: each way warms up for
// warmup, then Rounds slices per way, the order of the ways rotating every
// round.
func (b *bench) measureCell(ctx context.Context, workload string, clients int, warmup time.Duration) ([]*result, error) {
	type wayState struct {
		w       *way
		clients []client
		hists   []*hdrhistogram.Histogram
		res     *result
	}
	var states []*wayState
	for _, w := range b.ways {
		if !w.runs(workload) {
			continue
		}
		st := &wayState{w: w, res: &result{workload: workload, clients: clients, way: w.name}}
		for range clients {
			st.clients = append(st.clients, w.newClient())
			st.hists = append(st.hists, hdrhistogram.New(histMin, histMax, histSigFigs))
		}
		states = append(states, st)
	}
	defer func() {
		for _, st := range states {
			for _, c := range st.clients {
				c.close()
			}
		}
	}()
	if warmup > 0 {
		for _, st := range states {
			if err := b.slice(ctx, workload, st.w, st.clients, st.hists, warmup, nil); err != nil {
				return nil, err
			}
		}
	}
	d := b.cfg.Duration / time.Duration(b.cfg.Rounds)
	for r := range b.cfg.Rounds {
		for j := range states {
			st := states[(r+j)%len(states)]
			if err := b.slice(ctx, workload, st.w, st.clients, st.hists, d, st.res); err != nil {
				return nil, err
			}
		}
	}
	out := make([]*result, len(states))
	for i, st := range states {
		h := hdrhistogram.New(histMin, histMax, histSigFigs)
		for _, ch := range st.hists {
			h.Merge(ch)
		}
		st.res.hist = h
		out[i] = st.res
	}
	return out, nil
}
