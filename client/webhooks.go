package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// WebhookEndpoint is a merchant's receiver of settlement events. Secret is
// set only by CreateWebhookEndpoint and RotateWebhookSecret.
type WebhookEndpoint struct {
	ID             string    `json:"id"`
	URL            string    `json:"url"`
	Description    string    `json:"description"`
	EnabledEvents  []string  `json:"enabled_events"`
	MaxConcurrency int       `json:"max_concurrency"`
	Status         string    `json:"status"`
	DisabledReason string    `json:"disabled_reason,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	Secret         string    `json:"secret,omitempty"`
}

// WebhookEndpointParams create an endpoint; EnabledEvents nil means every
// event type, MaxConcurrency 0 the server's default (16 deliveries at
// once per instance; 1 to 64).
type WebhookEndpointParams struct {
	URL            string   `json:"url"`
	Description    string   `json:"description,omitempty"`
	EnabledEvents  []string `json:"enabled_events,omitempty"`
	MaxConcurrency int      `json:"max_concurrency,omitempty"`
}

// WebhookEndpointUpdate changes an endpoint: each field set is applied.
// Disabled false enables a disabled endpoint again.
type WebhookEndpointUpdate struct {
	Disabled       *bool    `json:"disabled,omitempty"`
	EnabledEvents  []string `json:"enabled_events,omitempty"`
	Description    *string  `json:"description,omitempty"`
	MaxConcurrency *int     `json:"max_concurrency,omitempty"`
}

// Event is a settlement event as delivered; Object is the charge.
type Event struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	Data      struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
	// DeliveryAttempts are the most recent attempts (GetEvent only);
	// ListEventAttempts pages through all of them.
	DeliveryAttempts        []DeliveryAttempt `json:"delivery_attempts,omitempty"`
	DeliveryAttemptsHasMore bool              `json:"delivery_attempts_has_more,omitempty"`
}

// DeliveryAttempt is one try at delivering an event to an endpoint.
type DeliveryAttempt struct {
	ID         string  `json:"id"`
	At         string  `json:"at"`
	Endpoint   string  `json:"endpoint"`
	StatusCode *int    `json:"status_code"`
	Error      *string `json:"error"`
	LatencyMS  float64 `json:"latency_ms"`
}

// WebhookTest is how a test event went.
type WebhookTest struct {
	Event      string  `json:"event"`
	Delivered  bool    `json:"delivered"`
	StatusCode *int    `json:"status_code"`
	Error      *string `json:"error"`
	LatencyMS  float64 `json:"latency_ms"`
}

// EventPage and AttemptPage are pages of a list, newest first.
type (
	EventPage struct {
		Events  []Event `json:"data"`
		HasMore bool    `json:"has_more"`
	}
	AttemptPage struct {
		Attempts []DeliveryAttempt `json:"data"`
		HasMore  bool              `json:"has_more"`
	}
)

// api makes one call of the webhook and event routes (retried as every
// call is: 429 and 5xx after Retry-After) and decodes a want answer into
// out. Creating an endpoint is not idempotent: a create retried after a
// lost answer may add a second one (ListWebhookEndpoints tells).
func (c *Client) api(ctx context.Context, method, path string, in any, want int, out any) error {
	cl := call{method: method, path: path}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("chargeonce: encoding the request: %w", err)
		}
		cl.body = b
	} else if method == http.MethodPost {
		cl.body = []byte{}
	}
	ex, n, err := c.run(ctx, cl)
	if err != nil {
		return err
	}
	if ex.status != want {
		return responseError(ex, n)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(ex.body, out); err != nil {
		return &finalError{fmt.Errorf("chargeonce: decoding a %d answer of %s %s: %w", ex.status, method, path, err), n}
	}
	return nil
}

// CreateWebhookEndpoint adds an endpoint; its Secret is shown only here.
func (c *Client) CreateWebhookEndpoint(ctx context.Context, p WebhookEndpointParams) (*WebhookEndpoint, error) {
	var e WebhookEndpoint
	return &e, c.api(ctx, http.MethodPost, "/v1/webhook_endpoints", p, http.StatusCreated, &e)
}

// ListWebhookEndpoints returns the merchant's endpoints, oldest first.
func (c *Client) ListWebhookEndpoints(ctx context.Context) ([]WebhookEndpoint, error) {
	var page struct {
		Data []WebhookEndpoint `json:"data"`
	}
	return page.Data, c.api(ctx, http.MethodGet, "/v1/webhook_endpoints", nil, http.StatusOK, &page)
}

// UpdateWebhookEndpoint changes an endpoint (enables it again, disables
// it, replaces its event types or description).
func (c *Client) UpdateWebhookEndpoint(ctx context.Context, id string, u WebhookEndpointUpdate) (*WebhookEndpoint, error) {
	var e WebhookEndpoint
	return &e, c.api(ctx, http.MethodPost, "/v1/webhook_endpoints/"+url.PathEscape(id), u, http.StatusOK, &e)
}

// DeleteWebhookEndpoint removes an endpoint and its pending deliveries.
func (c *Client) DeleteWebhookEndpoint(ctx context.Context, id string) error {
	return c.api(ctx, http.MethodDelete, "/v1/webhook_endpoints/"+url.PathEscape(id), nil, http.StatusNoContent, nil)
}

// RotateWebhookSecret gives an endpoint a new secret; the old one signs
// beside it for 24 hours.
func (c *Client) RotateWebhookSecret(ctx context.Context, id string) (*WebhookEndpoint, error) {
	var e WebhookEndpoint
	return &e, c.api(ctx, http.MethodPost, "/v1/webhook_endpoints/"+url.PathEscape(id)+"/rotate_secret", nil, http.StatusOK, &e)
}

// TestWebhookEndpoint sends the endpoint a signed webhook.test event now.
func (c *Client) TestWebhookEndpoint(ctx context.Context, id string) (*WebhookTest, error) {
	var r WebhookTest
	return &r, c.api(ctx, http.MethodPost, "/v1/webhook_endpoints/"+url.PathEscape(id)+"/test", nil, http.StatusOK, &r)
}

// RecoverWebhookEndpoint queues again, once each, the events whose
// delivery to the endpoint failed since, and returns how many.
func (c *Client) RecoverWebhookEndpoint(ctx context.Context, id string, since time.Time) (int, error) {
	var r struct {
		N int `json:"deliveries_queued"`
	}
	err := c.api(ctx, http.MethodPost, "/v1/webhook_endpoints/"+url.PathEscape(id)+"/recover",
		map[string]string{"since": since.UTC().Format(time.RFC3339)}, http.StatusAccepted, &r)
	return r.N, err
}

// ListEvents returns one page of the merchant's events, newest first;
// chargeID and startingAfter are optional ("").
func (c *Client) ListEvents(ctx context.Context, chargeID, startingAfter string, limit int) (*EventPage, error) {
	q := url.Values{}
	if chargeID != "" {
		q.Set("charge_id", chargeID)
	}
	if startingAfter != "" {
		q.Set("starting_after", startingAfter)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/events"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var page EventPage
	return &page, c.api(ctx, http.MethodGet, path, nil, http.StatusOK, &page)
}

// GetEvent returns an event with its most recent delivery attempts.
func (c *Client) GetEvent(ctx context.Context, id string) (*Event, error) {
	var ev Event
	return &ev, c.api(ctx, http.MethodGet, "/v1/events/"+url.PathEscape(id), nil, http.StatusOK, &ev)
}

// RedeliverEvent owes the event once more to every enabled endpoint (one
// already owed is made due now) and returns how many deliveries that is.
func (c *Client) RedeliverEvent(ctx context.Context, id string) (int, error) {
	var r struct {
		N int `json:"deliveries_queued"`
	}
	err := c.api(ctx, http.MethodPost, "/v1/events/"+url.PathEscape(id)+"/redeliver", nil, http.StatusAccepted, &r)
	return r.N, err
}

// ListEventAttempts returns one page of an event's delivery attempts,
// newest first; startingAfter ("" for the first page) is an attempt id.
func (c *Client) ListEventAttempts(ctx context.Context, eventID, startingAfter string, limit int) (*AttemptPage, error) {
	q := url.Values{}
	if startingAfter != "" {
		q.Set("starting_after", startingAfter)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/events/" + url.PathEscape(eventID) + "/attempts"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var page AttemptPage
	return &page, c.api(ctx, http.MethodGet, path, nil, http.StatusOK, &page)
}
