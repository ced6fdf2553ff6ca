package httpserve

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// BodyReadTimeout bounds how long a client may take to send a request's
// body once its headers have arrived. chargeonce's bodies are a few hundred
// bytes (64 KiB at most): a client that trickles one holds a connection,
// and a few thousand such clients would hold every connection the cap
// allows (SPEC "Tenants share the service fairly").
const BodyReadTimeout = 5 * time.Second

// guardBody gives r's body BodyReadTimeout to arrive, and makes sure that a
// handler which answers without reading the body (a 401 before the body,
// a 404, a refusal) is never held by it: the answer says Connection: close,
// and what remains of the body is not read after the handler returns
// (net/http would otherwise read up to 256 KiB of it, as slowly as the
// client sends it, before closing).
func guardBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(BodyReadTimeout))
		b := &bodyGuard{ReadCloser: r.Body, rc: rc}
		r.Body = b
		h.ServeHTTP(&closeUnread{ResponseWriter: w, body: b}, r)
		if !b.eof.Load() {
			// A deadline in the past: the body's remainder is not waited for.
			_ = rc.SetReadDeadline(time.Unix(1, 0))
		}
	})
}

// bodyGuard notes when a body has been read to its end, and then lifts the
// body's deadline: the server keeps reading the connection in the
// background to notice a client that hangs up, and a deadline there would
// cancel a charge that legitimately waits longer for the acquirer.
type bodyGuard struct {
	io.ReadCloser
	rc  *http.ResponseController
	eof atomic.Bool
}

func (b *bodyGuard) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.eof.Swap(true) {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// closeUnread answers Connection: close when the body was not read to its
// end: what is left of it on the wire cannot be parsed as a next request.
type closeUnread struct {
	http.ResponseWriter
	body  *bodyGuard
	wrote bool
}

func (w *closeUnread) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		if !w.body.eof.Load() {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closeUnread) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *closeUnread) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush implements http.Flusher when the underlying writer does.
func (w *closeUnread) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		if !w.wrote {
			w.WriteHeader(http.StatusOK)
		}
		f.Flush()
	}
}
