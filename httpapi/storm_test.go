package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// stormRequests is how many random and malformed requests
// TestRandomRequestStorm sends to each store.
const stormRequests = 2000

// TestRandomRequestStorm fires thousands of random and malformed requests —
// bodies, headers, idempotency keys, methods, paths and query strings, on
// raw connections so that nothing is cleaned up by a client library — at a
// running server on each store. No answer may be a 5xx, no rejected
// request may leave a record or a charge behind, and the server is still
// ready afterwards. The seed is logged; the counts are printed.
func TestRandomRequestStorm(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			host := strings.TrimPrefix(f.inst.URL, "http://")
			g := &stormGen{base: orderSeq.Add(1_000_000)}
			orderSeq.Add(2 * stormRequests)

			type result struct {
				req    stormReq
				status int
				body   []byte
				err    error
			}
			results := make([]result, stormRequests)
			start := time.Now()
			var wg sync.WaitGroup
			const workers = 8
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, uint64(w)))
					for i := w; i < stormRequests; i += workers {
						req := g.next(rng, i)
						status, body, err := req.send(host)
						results[i] = result{req, status, body, err}
					}
				}()
			}
			wg.Wait()

			counts := map[int]int{}
			accepted := map[string]bool{} // charge ids of accepted attempts
			noAnswer, transport501 := 0, 0
			for _, r := range results {
				if r.err != nil {
					noAnswer++
					continue
				}
				counts[r.status]++
				if r.status == 501 && r.req.unknownCoding() && strings.HasPrefix(string(r.body), "Unsupported transfer encoding") {
					// net/http itself answers an unknown transfer coding
					// with 501 (RFC 9112 section 6.1) before any handler
					// runs: not chargeonce's answer, and counted apart.
					transport501++
					continue
				}
				if r.status >= 500 {
					t.Errorf("seed %d: %s answered %d: %s", seed, r.req, r.status, r.body)
				}
				var ids struct {
					ID       string `json:"id"`
					ChargeID string `json:"charge_id"`
				}
				if (r.status == 201 || r.status == 202 || r.status == 402) && r.req.method == "POST" && json.Unmarshal(r.body, &ids) == nil {
					accepted[ids.ID+ids.ChargeID] = true
				}
			}
			// Nothing left behind by a rejected POST: no record under its
			// key, and no charge for its order that no accepted attempt made.
			ctx := t.Context()
			var rows atomic.Int64
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < len(results); i += workers {
						r := results[i]
						if r.err != nil || r.req.method != "POST" || r.status == 201 || r.status == 202 || r.status == 402 {
							continue
						}
						if r.req.key != "" && r.status != 409 && r.status != 422 {
							if rec, err := f.store.KeyGet(ctx, "demo", r.req.key); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
								rows.Add(1)
								t.Errorf("seed %d: %s answered %d but left record %+v (%v)", seed, r.req, r.status, rec.Charge, err)
							}
						}
						charges, err := f.store.ChargesListByOrder(ctx, "demo", r.req.order)
						if err != nil {
							t.Error(err)
							return
						}
						for _, c := range charges {
							if !accepted[c.ID] {
								rows.Add(1)
								t.Errorf("seed %d: %s answered %d but charge %s exists for its order", seed, r.req, r.status, c.ID)
							}
						}
					}
				}()
			}
			wg.Wait()
			if ready, err := apitest.Do(t, nil, "GET", f.inst.URL+"/readyz", nil, nil); err != nil || ready.Status != 200 {
				t.Fatalf("not ready after the storm: %v %d", err, ready.Status)
			}
			var summary []string
			for s, n := range counts {
				summary = append(summary, fmt.Sprintf("%d:%d", s, n))
			}
			sort.Strings(summary)
			t.Logf("%s: %d requests in %v (seed %d): statuses %s; %d without an answer; %d answers >= 500 from chargeonce (and %d of net/http's 501 for Transfer-Encoding: gzip); %d rows left by rejected requests; %d charges accepted; ready afterwards",
				kind, stormRequests, time.Since(start).Round(time.Millisecond), seed, strings.Join(summary, " "), noAnswer, countAtLeast(counts, 500)-transport501, transport501, rows.Load(), len(accepted))
			if noAnswer > stormRequests/100 {
				t.Fatalf("%d requests got no answer at all", noAnswer)
			}
		})
	}
}

func countAtLeast(counts map[int]int, lowest int) int {
	n := 0
	for s, c := range counts {
		if s >= lowest {
			n += c
		}
	}
	return n
}

// stormReq is one raw HTTP/1.1 request.
type stormReq struct {
	method, target string
	headers        []string // "Name: value" lines, sent as they are
	body           []byte
	key            string // the idempotency key, when it is a valid one
	order          int64
}

func (r stormReq) String() string {
	b := r.body
	if len(b) > 120 {
		b = b[:120]
	}
	return fmt.Sprintf("%q %q %q body %q", r.method, r.target, r.headers, b)
}

// unknownCoding reports whether the request names a transfer coding
// net/http does not implement.
func (r stormReq) unknownCoding() bool {
	for _, h := range r.headers {
		if strings.HasPrefix(h, "Transfer-Encoding:") && !strings.Contains(h, "chunked") {
			return true
		}
	}
	return false
}

// send writes the request on a fresh connection and reads the answer.
func (r stormReq) send(host string) (int, []byte, error) {
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	var w bytes.Buffer
	fmt.Fprintf(&w, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", r.method, r.target, host)
	for _, h := range r.headers {
		w.WriteString(h + "\r\n")
	}
	fmt.Fprintf(&w, "Content-Length: %d\r\n\r\n", len(r.body))
	w.Write(r.body)
	if _, err := conn.Write(w.Bytes()); err != nil {
		return 0, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 {
		resp, err = http.ReadResponse(br, nil) // 100 Continue: the answer follows
	}
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	return resp.StatusCode, body.Bytes(), nil
}

// stormGen makes random requests; order ids start at base, one per request.
type stormGen struct {
	base int64
}

var (
	stormMethods = []string{"POST", "POST", "POST", "POST", "GET", "GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT", "FOO", "post", "G\x00T", "PO ST"}
	stormStrings = []string{
		`a\u0000b`, `\u0000`, `\ud800`, `\udc00x`, `\ud83e\udd50`, `\ud83e\u0041`, "caf\xff", "\xed\xa0\x80", "\xc0\xaf",
		"ok", "é", "\u2028", `\"`, `\\`, strings.Repeat("x", 600), "", " ", "\t", "tok_ok", "tok_declined", `%00`, "\x7f", "\x01",
	}
	stormKeys = []string{
		"", `""`, `"`, `"abc`, `"a b"`, "a b", "clé", "a\x01b", strings.Repeat("k", 256), `"abc";v=1`, "\xff", "%00", "\"\\q\"",
	}
	stormAuth = []string{
		"Authorization: Bearer " + apitest.APIKey, "Authorization: Bearer " + apitest.APIKey, "Authorization: Bearer " + apitest.APIKey,
		"Authorization: Bearer " + apitest.OtherAPIKey, "Authorization: Bearer", "Authorization: Bearer  ", "Authorization: Basic ZGVtbzpzZWNyZXQ=",
		"Authorization: Bearer sk_test_demo\xff", "Authorization: bearer " + apitest.APIKey, "", "Authorization: Bearer \x00",
	}
)

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

// next returns request i.
func (g *stormGen) next(rng *rand.Rand, i int) stormReq {
	r := stormReq{order: g.base + int64(i)}
	// A third of the requests are well-formed charges but for their body
	// (itself mutated half of the time), so that many reach the store.
	wellFormed := rng.IntN(3) == 0
	r.method = pick(rng, stormMethods)
	r.target = g.target(rng, r.order)
	auth := pick(rng, stormAuth)
	keyChoice := rng.IntN(10)
	if wellFormed {
		r.method, r.target, auth, keyChoice = "POST", "/v1/charges", "Authorization: Bearer "+apitest.APIKey, 0
	}
	if auth != "" {
		r.headers = append(r.headers, auth)
	}
	switch n := keyChoice; {
	case n < 6: // a fresh, valid key
		r.key = fmt.Sprintf("storm-%d-%d", r.order, rng.Uint32())
		if rng.IntN(3) == 0 {
			r.headers = append(r.headers, `Idempotency-Key: "`+r.key+`"`)
		} else {
			r.headers = append(r.headers, "Idempotency-Key: "+r.key)
		}
	case n < 7: // two keys
		r.headers = append(r.headers, "Idempotency-Key: a", "Idempotency-Key: b")
	case n < 9:
		r.headers = append(r.headers, "Idempotency-Key: "+pick(rng, stormKeys))
	}
	if rng.IntN(2) == 0 {
		r.headers = append(r.headers, pick(rng, []string{"Content-Type: application/json", "Content-Type: text/plain", "Content-Type: application/json; charset=latin1", "X-Junk: \x01\x02", "Transfer-Encoding: gzip", "Expect: 100-continue", "Content-Length: 5"}))
	}
	r.body = g.body(rng, r.order)
	return r
}

func (g *stormGen) target(rng *rand.Rand, order int64) string {
	switch rng.IntN(12) {
	case 0, 1, 2, 3, 4:
		return "/v1/charges"
	case 5:
		return "/v1/charges/" + pick(rng, []string{"%00", "%FF", "%C3%28", "ch_%00", "ch_" + strings.Repeat("a", 3000), "..%2F..%2Fetc", "ch_x", "%ED%A0%80", url.PathEscape(pick(rng, stormStrings))})
	case 6:
		return "/v1/charges?order_id=" + pick(rng, []string{"%00", "%FF", "-1", "0", "9223372036854775808", "1e3", fmt.Sprint(order), "%zz", "", "1&order_id=2", url.QueryEscape(pick(rng, stormStrings))})
	case 7:
		return pick(rng, []string{"/", "/healthz", "/readyz", "/metrics", "/v2/charges", "//v1/charges", "/v1/charges/", "/v1/charges/a/b", "*", "/v1/%63harges", "/v1/charges#frag"})
	case 8:
		return "/v1/charges/" + pick(rng, stormStrings) // raw bytes in the request line
	case 9:
		return "http://example.com/v1/charges"
	default:
		return fmt.Sprintf("/v1/charges?order_id=%d&x=%s", order, pick(rng, []string{"%00", "%FF", "\xff", "a b"}))
	}
}

func (g *stormGen) body(rng *rand.Rand, order int64) []byte {
	token := pick(rng, []string{"tok_ok", "tok_ok", "tok_declined", "tok_" + fmt.Sprint(rng.Uint32()), pick(rng, stormStrings)})
	fields := []string{
		fmt.Sprintf(`"order_id": %d`, order),
		fmt.Sprintf(`"amount_cents": %d`, 1+rng.IntN(100000)),
		fmt.Sprintf(`"payment_token": "%s"`, token),
	}
	if rng.IntN(2) == 0 {
		fields = append(fields, fmt.Sprintf(`"description": "%s"`, pick(rng, stormStrings)))
	}
	if rng.IntN(4) == 0 {
		fields = append(fields, fmt.Sprintf(`"currency": "%s"`, pick(rng, []string{"BRL", "USD", "brl", "XYZ", "\u0000RL", `\u0000`, "€"})))
	}
	rng.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	b := []byte("{" + strings.Join(fields, ", ") + "}")
	switch rng.IntN(8) {
	case 0: // flip bytes
		for range 1 + rng.IntN(4) {
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		}
	case 1: // cut
		b = b[:rng.IntN(len(b))]
	case 2: // insert garbage
		at := rng.IntN(len(b))
		junk := pick(rng, []string{"\x00", "\xff", `\u0000`, `"`, "{", "]", ",", "\\", "\xed\xa0\x80", `\ud800`})
		b = append(b[:at:at], append([]byte(junk), b[at:]...)...)
	case 3: // not an object
		b = []byte(pick(rng, []string{"", "null", "[]", "1", `"x"`, "{}", "{{}", strings.Repeat("[", 5000), strings.Repeat(`{"a":`, 3000)}))
	case 4: // too big
		if rng.IntN(4) == 0 {
			b = append(b[:len(b)-1], []byte(`, "description": "`+strings.Repeat("x", 70<<10)+`"}`)...)
		}
	}
	return b
}
