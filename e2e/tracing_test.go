package e2e

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// collector is an OTLP/HTTP trace receiver: it keeps every span exported to
// it, with the service.name of the process that sent it.
type collector struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []exported
}

type exported struct {
	service, name, traceID, spanID, parentID string
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		var req collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			service := ""
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					c.spans = append(c.spans, exported{service: service, name: sp.GetName(),
						traceID: fmt.Sprintf("%x", sp.GetTraceId()), spanID: fmt.Sprintf("%x", sp.GetSpanId()), parentID: fmt.Sprintf("%x", sp.GetParentSpanId())})
				}
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// names returns "service/name" of every span of trace id.
func (c *collector) names(id string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, s := range c.spans {
		if s.traceID == id {
			out = append(out, s.service+"/"+s.name)
		}
	}
	return out
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.spans)
}

// TestTracesExportedOverOTLP runs the built binary: serve and the acquirer
// simulator, with OTEL_EXPORTER_OTLP_ENDPOINT pointing at a collector,
// export one trace for a charge that came in with a caller's traceparent:
// serve's server span, store calls and statements, its acquirer call, and
// the simulator's own server span, all in the caller's trace; serve's
// request log line names the trace. A serve without the variable exports
// nothing and its log lines name no trace.
func TestTracesExportedOverOTLP(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ps := newProcs(t)
	col := newCollector(t)
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100"}
	acq := ps.startEnv("acquirer", env, "acquirer", "--addr", "127.0.0.1:0")
	traced := ps.startEnv("traced", env, serveArgs(url, acq.URL())...)
	plain := ps.start("plain", serveArgs(url, acq.URL())...)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest("POST", traced.URL()+"/v1/charges", bytes.NewReader(chargeBody(newOrder(), "tok_ok")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apitest.APIKey)
	req.Header.Set("Idempotency-Key", "otlp-"+uniqueName("k"))
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("charge: %d", resp.StatusCode)
	}
	want := []string{
		"chargeonce-serve/POST /v1/charges", "chargeonce-serve/store.KeyInsert", "chargeonce-serve/INSERT",
		"chargeonce-serve/acquirer.Capture", "chargeonce-serve/store.KeyComplete", "chargeonce-acquirer/POST /v1/captures",
	}
	var got []string
	apitest.Eventually(t, 30*time.Second, "the charge's spans to reach the collector", func() bool {
		got = col.names(traceID)
		joined := "," + strings.Join(got, ",") + ","
		for _, w := range want {
			if !strings.Contains(joined, ","+w+",") {
				return false
			}
		}
		return true
	})
	t.Logf("trace %s at the collector: %s", traceID, strings.Join(got, ", "))
	line := regexp.MustCompile(`(?m)^.*msg=request .*$`).FindString(traced.logText())
	if !strings.Contains(line, "trace_id="+traceID) {
		t.Errorf("the traced serve's request line does not name trace %s:\n%s", traceID, line)
	}

	before := col.count()
	if a := charge(http.DefaultClient, plain.URL(), "otlp-plain-"+uniqueName("k"), chargeBody(newOrder(), "tok_ok")); a.status != 201 {
		t.Fatalf("charge on the untraced serve: %s", a)
	}
	time.Sleep(500 * time.Millisecond) // five export intervals of the traced processes
	for _, s := range col.names("") {
		t.Errorf("a span without a trace id: %s", s)
	}
	log := plain.logText()
	if strings.Contains(log, "trace_id=") || strings.Contains(log, "tracing:") {
		t.Errorf("the serve without OTEL_EXPORTER_OTLP_ENDPOINT traces:\n%s", log)
	}
	col.mu.Lock()
	for _, s := range col.spans[before:] {
		if s.service == "chargeonce-serve" && s.traceID != traceID {
			// The untraced serve exports nothing: any new serve span must
			// come from the traced one (its background work is not sampled).
			t.Errorf("a span no traced request made: %+v", s)
		}
	}
	col.mu.Unlock()
}
