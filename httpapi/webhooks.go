package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/webhook"
)

// Limits of the webhook endpoints API.
const (
	// MaxWebhookEndpoints is how many endpoints one merchant may have.
	MaxWebhookEndpoints = chargeonce.MaxWebhookEndpoints
	maxDescriptionLen   = 500
	maxWebhookIDLen     = 64
)

// routeWebhooks adds the endpoints and events API (SPEC "Settlement events
// and webhooks") to s.
func (s *Server) routeWebhooks() {
	s.mux.HandleFunc("POST /v1/webhook_endpoints", s.handleCreateEndpoint)
	s.mux.HandleFunc("GET /v1/webhook_endpoints", s.handleListEndpoints)
	s.mux.HandleFunc("GET /v1/webhook_endpoints/{id}", s.handleGetEndpoint)
	s.mux.HandleFunc("DELETE /v1/webhook_endpoints/{id}", s.handleDeleteEndpoint)
	s.mux.HandleFunc("POST /v1/webhook_endpoints/{id}", s.handleUpdateEndpoint)
	s.mux.HandleFunc("POST /v1/webhook_endpoints/{id}/recover", s.handleRecoverEndpoint)
	s.mux.HandleFunc("POST /v1/webhook_endpoints/{id}/test", s.handleTestEndpoint)
	s.mux.HandleFunc("POST /v1/webhook_endpoints/{id}/rotate_secret", s.handleRotateSecret)
	s.mux.HandleFunc("GET /v1/events", s.handleListEvents)
	s.mux.HandleFunc("GET /v1/events/{id}", s.handleGetEvent)
	s.mux.HandleFunc("POST /v1/events/{id}/redeliver", s.handleRedeliver)
	s.mux.HandleFunc("GET /v1/events/{id}/attempts", s.handleListAttempts)
	for _, p := range []string{"/v1/webhook_endpoints", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/{id}/rotate_secret",
		"/v1/webhook_endpoints/{id}/recover", "/v1/webhook_endpoints/{id}/test",
		"/v1/events", "/v1/events/{id}", "/v1/events/{id}/redeliver", "/v1/events/{id}/attempts"} {
		s.mux.HandleFunc(p, s.methodNotAllowed)
	}
}

// endpointJSON is the public form of an endpoint; Secret only on creation
// and rotation.
type endpointJSON struct {
	ID             string   `json:"id"`
	Object         string   `json:"object"`
	URL            string   `json:"url"`
	Description    string   `json:"description"`
	EnabledEvents  []string `json:"enabled_events"`
	MaxConcurrency int      `json:"max_concurrency"`
	Status         string   `json:"status"`
	DisabledReason string   `json:"disabled_reason,omitempty"`
	CreatedAt      string   `json:"created_at"`
	Secret         string   `json:"secret,omitempty"`
}

func endpointOut(e chargeonce.WebhookEndpoint, withSecret bool) endpointJSON {
	out := endpointJSON{ID: e.ID, Object: "webhook_endpoint", URL: e.URL, Description: e.Description, Status: string(e.Status),
		DisabledReason: e.DisabledReason, CreatedAt: e.CreatedAt.UTC().Format(time.RFC3339), EnabledEvents: e.EnabledEvents,
		MaxConcurrency: e.Concurrency()}
	if len(out.EnabledEvents) == 0 {
		out.EnabledEvents = []string{"*"}
	}
	if withSecret {
		out.Secret = e.Secret
	}
	return out
}

func (s *Server) writeValue(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.log.Error("encoding an answer", "err", err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	writeJSON(w, status, b)
}

// plausibleWebhookID tells whether id could be an endpoint's or an event's:
// anything else is not found without asking the store.
func plausibleWebhookID(id string) bool {
	return id != "" && len(id) <= maxWebhookIDLen && plausibleChargeID(id)
}

// webhookTarget authenticates r and reads the endpoint's or event's id in
// its path (what names which, for the 404); false when it has answered.
func (s *Server) webhookTarget(w http.ResponseWriter, r *http.Request, what string) (chargeonce.Merchant, string, bool) {
	merchant, ok := s.webhookAuth(w, r)
	if !ok {
		return chargeonce.Merchant{}, "", false
	}
	id := r.PathValue("id")
	if !plausibleWebhookID(id) {
		s.writeError(w, r, chargeonce.Errorf(chargeonce.ENOTFOUND, "no %s has that id", what))
		return chargeonce.Merchant{}, "", false
	}
	return merchant, id, true
}

func (s *Server) handleCreateEndpoint(w http.ResponseWriter, r *http.Request) {
	merchant, ok := s.webhookAuth(w, r)
	if !ok {
		return
	}
	var in struct {
		URL            string   `json:"url"`
		Description    string   `json:"description"`
		EnabledEvents  []string `json:"enabled_events"`
		MaxConcurrency *int     `json:"max_concurrency"`
	}
	if !s.decodeMerchantBody(w, r, merchant.ID, &in) {
		return
	}
	var err error
	switch {
	case in.URL == "":
		err = chargeonce.FieldError("url", "url is required")
	case !chargeonce.ValidText(in.URL):
		err = chargeonce.FieldError("url", "url must be valid UTF-8 text")
	case !chargeonce.ValidText(in.Description) || len([]rune(in.Description)) > maxDescriptionLen:
		err = chargeonce.FieldError("description", "description must be text of at most %d characters", maxDescriptionLen)
	}
	if err == nil {
		if uerr := webhook.CheckURL(in.URL, s.webhooksAllowPrivate); uerr != nil {
			err = chargeonce.FieldError("url", "%v", uerr)
		}
	}
	var events []string
	if err == nil && in.EnabledEvents != nil {
		events, err = checkEventTypes(in.EnabledEvents)
	}
	var conc int
	if err == nil && in.MaxConcurrency != nil {
		conc = *in.MaxConcurrency
		err = chargeonce.CheckEndpointConcurrency(conc)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The store refuses an endpoint past MaxWebhookEndpoints, atomically.
	e, err := s.store.WebhookEndpointCreate(r.Context(), chargeonce.WebhookEndpoint{
		ID: "we_" + idempotency.NewToken()[:24], MerchantID: merchant.ID, URL: in.URL, Description: in.Description, Secret: webhook.NewSecret(),
		EnabledEvents: events, MaxConcurrency: conc,
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("webhook endpoint created", "merchant", merchant.ID, "endpoint", e.ID, "url", webhook.RedactURL(e.URL))
	s.writeValue(w, http.StatusCreated, endpointOut(e, true))
}

func (s *Server) handleListEndpoints(w http.ResponseWriter, r *http.Request) {
	merchant, ok := s.webhookAuth(w, r)
	if !ok {
		return
	}
	if r.URL.RawQuery != "" {
		s.writeError(w, r, chargeonce.FieldError("query", "GET /v1/webhook_endpoints takes no query parameters"))
		return
	}
	eps, err := s.store.WebhookEndpointsList(r.Context(), merchant.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	data := make([]endpointJSON, len(eps))
	for i, e := range eps {
		data[i] = endpointOut(e, false)
	}
	s.writeValue(w, http.StatusOK, map[string]any{"object": "list", "data": data, "has_more": false, "url": "/v1/webhook_endpoints"})
}

// handleGetEndpoint answers one of the merchant's endpoints as the list
// shows it (no secret); 404 for none or another merchant's. A merchant has
// at most chargeonce.MaxWebhookEndpoints, so it is found in their list.
func (s *Server) handleGetEndpoint(w http.ResponseWriter, r *http.Request) {
	if e, ok := s.merchantEndpoint(w, r); ok {
		s.writeValue(w, http.StatusOK, endpointOut(e, false))
	}
}

// merchantEndpoint reads the request's merchant's endpoint {id} from their
// list (a merchant has at most chargeonce.MaxWebhookEndpoints), or answers
// the error: 404 for none or another merchant's.
func (s *Server) merchantEndpoint(w http.ResponseWriter, r *http.Request) (chargeonce.WebhookEndpoint, bool) {
	merchant, id, ok := s.webhookTarget(w, r, "webhook endpoint")
	if !ok {
		return chargeonce.WebhookEndpoint{}, false
	}
	eps, err := s.store.WebhookEndpointsList(r.Context(), merchant.ID)
	if err != nil {
		s.writeError(w, r, err)
		return chargeonce.WebhookEndpoint{}, false
	}
	i := slices.IndexFunc(eps, func(e chargeonce.WebhookEndpoint) bool { return e.ID == id })
	if i < 0 {
		s.writeError(w, r, chargeonce.Errorf(chargeonce.ENOTFOUND, "no webhook endpoint has that id"))
		return chargeonce.WebhookEndpoint{}, false
	}
	return eps[i], true
}

func (s *Server) handleDeleteEndpoint(w http.ResponseWriter, r *http.Request) {
	merchant, id, ok := s.webhookTarget(w, r, "webhook endpoint")
	if !ok {
		return
	}
	if err := s.store.WebhookEndpointDelete(r.Context(), merchant.ID, id); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("webhook endpoint deleted", "merchant", merchant.ID, "endpoint", id)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleRotateSecret(w http.ResponseWriter, r *http.Request) {
	merchant, id, ok := s.webhookTarget(w, r, "webhook endpoint")
	if !ok {
		return
	}
	e, err := s.store.WebhookEndpointRotate(r.Context(), merchant.ID, id, webhook.NewSecret(), chargeonce.WebhookSecretOverlap)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("webhook secret rotated", "merchant", merchant.ID, "endpoint", id)
	s.writeValue(w, http.StatusOK, endpointOut(e, true))
}

// eventJSON is an event as the API shows it: the delivered body, plus
// (for GET /v1/events/{id}) its delivery attempts.
func (s *Server) eventJSON(r *http.Request, ev chargeonce.WebhookEvent) (map[string]any, error) {
	object, err := webhook.EventObject(r.Context(), s.store, ev)
	if err != nil {
		return nil, err
	}
	return map[string]any{
		"id": ev.ID, "object": "event", "type": ev.Type, "created_at": ev.CreatedAt.UTC().Format(time.RFC3339Nano),
		"data": map[string]any{"object": json.RawMessage(object)},
	}, nil
}

// eventsParams are the query parameters GET /v1/events understands.
var eventsParams = map[string]bool{"limit": true, "starting_after": true, "charge_id": true}

func (s *Server) handleListEvents(w http.ResponseWriter, r *http.Request) {
	merchant, ok := s.webhookAuth(w, r)
	if !ok {
		return
	}
	p := chargeonce.EventsListParams{MerchantID: merchant.ID, Limit: chargeonce.EventsListDefaultLimit}
	q, limit, err := listQuery(r.URL.RawQuery, eventsParams, "GET /v1/events takes limit, starting_after and charge_id", chargeonce.EventsListMaxLimit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if limit > 0 {
		p.Limit = limit
	}
	p.StartingAfter, p.ChargeID = q.Get("starting_after"), q.Get("charge_id")
	page, err := s.store.WebhookEventsList(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	data := make([]map[string]any, 0, len(page.Events))
	for _, ev := range page.Events {
		j, err := s.eventJSON(r, ev)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		data = append(data, j)
	}
	s.writeValue(w, http.StatusOK, map[string]any{"object": "list", "data": data, "has_more": page.HasMore, "url": "/v1/events"})
}

func (s *Server) handleGetEvent(w http.ResponseWriter, r *http.Request) {
	merchant, id, ok := s.webhookTarget(w, r, "event")
	if !ok {
		return
	}
	ev, _, err := s.store.WebhookEventGet(r.Context(), merchant.ID, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	j, err := s.eventJSON(r, ev)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The most recent attempts only, oldest first; the rest are paged by
	// GET /v1/events/{id}/attempts.
	page, err := s.store.WebhookAttemptsList(r.Context(), chargeonce.AttemptsListParams{
		MerchantID: merchant.ID, EventID: id, Limit: chargeonce.EventAttemptsEmbedded})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	as := attemptsOut(page.Attempts)
	slices.Reverse(as)
	j["delivery_attempts"] = as
	j["delivery_attempts_has_more"] = page.HasMore
	s.writeValue(w, http.StatusOK, j)
}

// attemptJSON is a delivery attempt as the API shows it.
type attemptJSON struct {
	ID         string  `json:"id"`
	Object     string  `json:"object"`
	At         string  `json:"at"`
	Endpoint   string  `json:"endpoint"`
	StatusCode *int    `json:"status_code"`
	Error      *string `json:"error"`
	LatencyMS  float64 `json:"latency_ms"`
}

// attemptIDPrefix begins an attempt's id in the API: att_ and its number.
const attemptIDPrefix = "att_"

func attemptsOut(attempts []chargeonce.WebhookAttempt) []attemptJSON {
	as := make([]attemptJSON, len(attempts))
	for i, a := range attempts {
		as[i] = attemptJSON{ID: attemptIDPrefix + strconv.FormatInt(a.ID, 10), Object: "webhook_attempt",
			At: a.At.UTC().Format(time.RFC3339Nano), Endpoint: a.EndpointID, LatencyMS: float64(a.Latency.Microseconds()) / 1000}
		if a.StatusCode != 0 {
			as[i].StatusCode = &attempts[i].StatusCode
		}
		if a.Error != "" {
			as[i].Error = &attempts[i].Error
		}
	}
	return as
}

// attemptsParams are the query parameters GET /v1/events/{id}/attempts
// understands.
var attemptsParams = map[string]bool{"limit": true, "starting_after": true}

func (s *Server) handleListAttempts(w http.ResponseWriter, r *http.Request) {
	merchant, id, ok := s.webhookTarget(w, r, "event")
	if !ok {
		return
	}
	p := chargeonce.AttemptsListParams{MerchantID: merchant.ID, EventID: id, Limit: chargeonce.AttemptsListDefaultLimit}
	q, limit, err := listQuery(r.URL.RawQuery, attemptsParams, "GET /v1/events/{id}/attempts takes limit and starting_after", chargeonce.AttemptsListMaxLimit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if limit > 0 {
		p.Limit = limit
	}
	if v := q.Get("starting_after"); v != "" {
		n, err := strconv.ParseInt(strings.TrimPrefix(v, attemptIDPrefix), 10, 64)
		if !strings.HasPrefix(v, attemptIDPrefix) || err != nil || n <= 0 {
			s.writeError(w, r, chargeonce.FieldError("starting_after", "starting_after must be an attempt's id (att_…)"))
			return
		}
		p.StartingAfter = n
	}
	page, err := s.store.WebhookAttemptsList(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeValue(w, http.StatusOK, map[string]any{"object": "list", "data": attemptsOut(page.Attempts), "has_more": page.HasMore,
		"url": "/v1/events/" + id + "/attempts"})
}

func (s *Server) handleRedeliver(w http.ResponseWriter, r *http.Request) {
	merchant, id, ok := s.webhookTarget(w, r, "event")
	if !ok {
		return
	}
	n, err := s.store.WebhookEventRedeliver(r.Context(), merchant.ID, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeValue(w, http.StatusAccepted, map[string]any{"id": id, "object": "event", "deliveries_queued": n})
}

// checkEventTypes reads an enabled_events list: known types, or "*" alone
// for every type (returned as nil).
func checkEventTypes(types []string) ([]string, error) {
	if len(types) == 0 {
		return nil, chargeonce.FieldError("enabled_events", `enabled_events must list event types, or be ["*"] for every type`)
	}
	if len(types) == 1 && types[0] == "*" {
		return nil, nil
	}
	var out []string
	for _, t := range types {
		if !slices.Contains(chargeonce.EventTypes, t) {
			return nil, chargeonce.FieldError("enabled_events", "enabled_events: unknown event type; the types are %s, or * for every type",
				strings.Join(chargeonce.EventTypes, ", "))
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out, nil
}

// handleUpdateEndpoint changes an endpoint: {"disabled": false} enables a
// disabled one again (Stripe's and Svix's way), {"disabled": true}
// disables it, enabled_events, description and max_concurrency replace
// theirs.
func (s *Server) handleUpdateEndpoint(w http.ResponseWriter, r *http.Request) {
	merchant, id, ok := s.webhookTarget(w, r, "webhook endpoint")
	if !ok {
		return
	}
	var in struct {
		Disabled       *bool     `json:"disabled"`
		EnabledEvents  *[]string `json:"enabled_events"`
		Description    *string   `json:"description"`
		MaxConcurrency *int      `json:"max_concurrency"`
	}
	if !s.decodeMerchantBody(w, r, merchant.ID, &in) {
		return
	}
	u := chargeonce.WebhookEndpointUpdate{Disabled: in.Disabled, Description: in.Description, MaxConcurrency: in.MaxConcurrency}
	if in.MaxConcurrency != nil {
		if err := chargeonce.CheckEndpointConcurrency(*in.MaxConcurrency); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if in.Description != nil && (!chargeonce.ValidText(*in.Description) || len([]rune(*in.Description)) > maxDescriptionLen) {
		s.writeError(w, r, chargeonce.FieldError("description", "description must be text of at most %d characters", maxDescriptionLen))
		return
	}
	if in.EnabledEvents != nil {
		events, err := checkEventTypes(*in.EnabledEvents)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if events == nil {
			events = []string{}
		}
		u.EnabledEvents = &events
	}
	if u.Disabled == nil && u.EnabledEvents == nil && u.Description == nil && u.MaxConcurrency == nil {
		s.writeError(w, r, chargeonce.FieldError("disabled", "give disabled, enabled_events, description or max_concurrency"))
		return
	}
	e, err := s.store.WebhookEndpointUpdate(r.Context(), merchant.ID, id, u)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("webhook endpoint updated", "merchant", merchant.ID, "endpoint", id, "status", e.Status)
	s.writeValue(w, http.StatusOK, endpointOut(e, false))
}

// handleRecoverEndpoint queues again, once each, the events whose delivery
// to the endpoint failed since a time: WebhookRecoverLimit a call at most,
// next_since saying where the next call goes on from, and one call an
// endpoint every WebhookRecoverCooldown (429 with Retry-After sooner).
func (s *Server) handleRecoverEndpoint(w http.ResponseWriter, r *http.Request) {
	merchant, id, ok := s.webhookTarget(w, r, "webhook endpoint")
	if !ok {
		return
	}
	var in struct {
		Since string `json:"since"`
	}
	if !s.decodeMerchantBody(w, r, merchant.ID, &in) {
		return
	}
	since, perr := time.Parse(time.RFC3339, in.Since)
	if perr != nil || since.Year() < 2000 {
		s.writeError(w, r, chargeonce.FieldError("since", "since must be an RFC 3339 time, as in 2026-12-01T00:00:00Z"))
		return
	}
	rec, err := s.store.WebhookEndpointRecover(r.Context(), chargeonce.WebhookRecoverParams{MerchantID: merchant.ID, EndpointID: id,
		Since: since, Limit: chargeonce.WebhookRecoverLimit, Cooldown: chargeonce.WebhookRecoverCooldown})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := map[string]any{"id": id, "object": "webhook_endpoint", "deliveries_queued": rec.Queued, "has_more": rec.HasMore}
	if rec.HasMore {
		out["next_since"] = rec.Next.UTC().Format(time.RFC3339Nano)
	}
	s.writeValue(w, http.StatusAccepted, out)
}

// handleTestEndpoint sends the endpoint a webhook.test event now and says
// how it went; it is neither recorded nor retried. A merchant has at most
// webhook.MaxTestsInFlight under way: 429 beyond.
func (s *Server) handleTestEndpoint(w http.ResponseWriter, r *http.Request) {
	e, ok := s.merchantEndpoint(w, r)
	if !ok {
		return
	}
	evID, a, err := s.tester.Send(r.Context(), e)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	a.EventID, a.EndpointID = evID, e.ID
	out := attemptsOut([]chargeonce.WebhookAttempt{a})[0]
	s.writeValue(w, http.StatusOK, map[string]any{"object": "webhook_test", "event": evID, "type": chargeonce.EventTest,
		"delivered": a.StatusCode >= 200 && a.StatusCode < 300, "status_code": out.StatusCode, "error": out.Error, "latency_ms": out.LatencyMS})
}
