package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Event is a settlement event as delivered: data.object is the charge, as
// GET /v1/charges/{id} shows it.
type Event struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	Data      struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
}

// ErrSignature is matched (errors.Is) by Verify's error when no signature
// of the message matches the secret, or its timestamp is more than five
// minutes away.
var ErrSignature = errors.New("webhook signature does not verify")

// Verify checks a delivery's Standard Webhooks headers against secret (a
// whsec_ secret) and returns the event. A message signed by two secrets
// (during a rotation) verifies when either is the receiver's.
func Verify(secret string, body []byte, h http.Header) (Event, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return Event{}, fmt.Errorf("webhook secret: %w", err)
	}
	if err := wh.Verify(body, h); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrSignature, err)
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return Event{}, fmt.Errorf("decoding webhook event: %w", err)
	}
	if ev.ID != h.Get(HeaderID) {
		return Event{}, fmt.Errorf("%w: the event id %q is not the webhook-id %q", ErrSignature, ev.ID, h.Get(HeaderID))
	}
	return ev, nil
}

// Seen remembers which webhook-ids a receiver has handled, so a delivery
// repeated (delivery is at least once) is acknowledged without being
// handled twice. Put it in the receiver's own database, in the transaction
// that acts on the event, where it can; MemorySeen is for tests and
// single-process receivers.
type Seen interface {
	// Seen reports whether id was handled.
	Seen(ctx context.Context, id string) (bool, error)
	// Remember records that id was handled.
	Remember(ctx context.Context, id string) error
}

// MemorySeen is a Seen in memory, forgetting nothing.
type MemorySeen struct {
	mu  sync.Mutex
	ids map[string]bool
}

// Seen implements Seen.
func (m *MemorySeen) Seen(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ids[id], nil
}

// Remember implements Seen.
func (m *MemorySeen) Remember(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ids == nil {
		m.ids = map[string]bool{}
	}
	m.ids[id] = true
	return nil
}

// maxBody bounds what Handler reads: an event is a charge, far smaller.
const maxBody = 1 << 20

// Handler receives settlement events: it verifies each delivery (401 when
// it does not), acknowledges an already handled webhook-id with 200
// without calling Handle again, and otherwise calls Handle and remembers
// the id once it returns nil (200). An error from Handle is a 500, so the
// sender retries later.
type Handler struct {
	Secret string
	Seen   Seen
	Handle func(ctx context.Context, ev Event) error
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		http.Error(w, "reading body", http.StatusBadRequest)
		return
	}
	ev, err := Verify(h.Secret, body, r.Header)
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	ctx := r.Context()
	if seen, err := h.Seen.Seen(ctx, ev.ID); err != nil {
		http.Error(w, "dedupe store: "+err.Error(), http.StatusInternalServerError)
		return
	} else if seen {
		w.WriteHeader(http.StatusOK)
		return
	}
	if err := h.Handle(ctx, ev); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := h.Seen.Remember(ctx, ev.ID); err != nil {
		http.Error(w, "dedupe store: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
}
