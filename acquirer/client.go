package acquirer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
)

// maxResponseBytes bounds how much of an answer the Client reads.
const maxResponseBytes = 1 << 20

// Client is a chargeonce.Acquirer that speaks the simulator's HTTP API (see
// Handler) to a remote acquirer.
//
// Capture returns a result only for a 200 answer with status captured or
// declined; everything else (a transport error, a timeout, any other status,
// a body it cannot decode) is an error, because the capture may or may not
// have happened and must be re-driven with the same reference. Bound each
// call with the context: the Client sets no timeout of its own.
type Client struct {
	base string
	http *http.Client
}

var _ chargeonce.Acquirer = (*Client)(nil)

// NewClient returns a Client for the acquirer at baseURL (for example
// http://127.0.0.1:8090). A nil httpClient means http.DefaultClient.
func NewClient(baseURL string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), http: httpClient}
}

// StatusError is the error of an answer whose status is not 200. It matches
// ErrUnavailable (errors.Is) when the status is 503.
type StatusError struct {
	// StatusCode is the HTTP status of the answer.
	StatusCode int
	// Problem is the answer's problem details, when it sent any.
	Problem chargeonce.Problem
}

// Error implements error.
func (e *StatusError) Error() string {
	msg := fmt.Sprintf("answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Problem.Detail != "" {
		msg += ": " + e.Problem.Detail
	}
	return msg
}

// Is reports whether the answer was a 503, so that errors.Is(err,
// ErrUnavailable) holds for the simulator in-process and over HTTP alike,
// and whether it was a definite refusal (chargeonce.ErrCaptureRejected; see
// Rejected).
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrUnavailable:
		return e.StatusCode == http.StatusServiceUnavailable
	case chargeonce.ErrCaptureRejected:
		return Rejected(e.StatusCode)
	}
	return false
}

// Rejected reports whether an answer with status to a capture request is a
// definite refusal: a 4xx that says the request itself will never be
// captured, so nothing moved and sending it again cannot help. Excluded are
// the 4xx answers that describe our configuration or a transient state
// rather than the charge: 401 and 403 (our credentials: fix them and the
// capture goes through), 404 (a wrong acquirer URL), 408, 409, 425 and 429
// (try again later). Those stay unknown outcomes, re-driven with back-off.
func Rejected(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusRequestTimeout,
		http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 400 && status < 500
}

// Capture sends req to POST /v1/captures with req.Reference as its
// Idempotency-Key. A nil error is the acquirer's definite answer; an error
// matching chargeonce.ErrCaptureRejected is a definite refusal (see
// Rejected); any other error means the outcome is unknown.
func (c *Client) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	var resp captureResponse
	if err := c.post(ctx, "/v1/captures", req.Reference, req, &resp); err != nil {
		return chargeonce.CaptureResult{}, fmt.Errorf("acquirer: capturing %s: %w", req.Reference, err)
	}
	res := chargeonce.CaptureResult{Reference: resp.Reference, Status: resp.Status}
	if resp.DeclineCode != nil {
		res.DeclineCode = *resp.DeclineCode
	}
	switch {
	case res.Reference != req.Reference:
		return chargeonce.CaptureResult{}, fmt.Errorf("acquirer: capturing %s: the answer is for reference %q", req.Reference, res.Reference)
	case res.Status == chargeonce.StatusCaptured && res.DeclineCode == "":
	case res.Status == chargeonce.StatusDeclined:
	default:
		return chargeonce.CaptureResult{}, fmt.Errorf("acquirer: capturing %s: unexpected answer: status %q, decline_code %q", req.Reference, res.Status, res.DeclineCode)
	}
	return res, nil
}

// Lookup implements chargeonce.Acquirer with GET /v1/captures/{reference}:
// LookupFound with the settled capture on 200; LookupSafeToSend on the
// simulator API's own 404, a problem+json of type not-found (the acquirer
// holds no capture under that reference); LookupUnsure on any other 404 (a
// bare 404 comes from a proxy or a wrong URL, not from the acquirer's
// records) and on 409 (the capture is under way); an error for anything
// else.
func (c *Client) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	reference := req.Reference
	hreq, err := c.newGet(ctx, "/v1/captures/"+url.PathEscape(reference))
	if err != nil {
		return chargeonce.LookupResult{}, err
	}
	var capture Capture
	err = c.do(hreq, &capture)
	if se, ok := errors.AsType[*StatusError](err); ok {
		switch {
		case se.StatusCode == http.StatusNotFound && se.Problem.Type == chargeonce.ProblemTypeBase+chargeonce.ENOTFOUND:
			return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "the acquirer holds no capture under the reference"}, nil
		case se.StatusCode == http.StatusNotFound:
			return chargeonce.LookupResult{Reason: "a 404 without the acquirer's not-found problem details (a proxy, or a wrong URL?)"}, nil
		case se.StatusCode == http.StatusConflict:
			return chargeonce.LookupResult{Reason: "the capture is under way"}, nil
		}
	}
	if err != nil {
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: looking up %s: %w", reference, err)
	}
	res := capture.Result()
	switch {
	case res.Reference != reference:
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: looking up %s: the answer is for reference %q", reference, res.Reference)
	case res.Status == chargeonce.StatusCaptured && res.DeclineCode == "":
	case res.Status == chargeonce.StatusAuthorized && res.DeclineCode == "":
	case res.Status == chargeonce.StatusDeclined:
	default:
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: looking up %s: unexpected answer: status %q, decline_code %q", reference, res.Status, res.DeclineCode)
	}
	return chargeonce.LookupResult{Status: chargeonce.LookupFound, Result: res}, nil
}

// Get returns the settled capture for reference; found is false on 404.
func (c *Client) Get(ctx context.Context, reference string) (capture Capture, found bool, err error) {
	hreq, err := c.newGet(ctx, "/v1/captures/"+url.PathEscape(reference))
	if err != nil {
		return Capture{}, false, err
	}
	err = c.do(hreq, &capture)
	if se, ok := errors.AsType[*StatusError](err); ok && se.StatusCode == http.StatusNotFound {
		return Capture{}, false, nil
	}
	if err != nil {
		return Capture{}, false, fmt.Errorf("acquirer: getting capture %s: %w", reference, err)
	}
	return capture, true, nil
}

// ListByOrder returns every settled capture of the merchant's order.
func (c *Client) ListByOrder(ctx context.Context, orderID int64, merchant string) ([]Capture, error) {
	q := url.Values{"order_id": {strconv.FormatInt(orderID, 10)}, "merchant": {merchant}}
	hreq, err := c.newGet(ctx, "/v1/captures?"+q.Encode())
	if err != nil {
		return nil, err
	}
	var list []Capture
	if err := c.do(hreq, &list); err != nil {
		return nil, fmt.Errorf("acquirer: listing captures of order %d: %w", orderID, err)
	}
	return list, nil
}

// Stats returns the acquirer's counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	hreq, err := c.newGet(ctx, "/v1/stats")
	if err != nil {
		return Stats{}, err
	}
	var st Stats
	if err := c.do(hreq, &st); err != nil {
		return Stats{}, fmt.Errorf("acquirer: getting stats: %w", err)
	}
	return st, nil
}

// post sends in as JSON to path with reference as its Idempotency-Key, as
// every money operation of the simulator's API is sent, and decodes the 200
// answer into out (do).
func (c *Client) post(ctx context.Context, path, reference string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encoding the request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if reference != "" {
		hreq.Header.Set("Idempotency-Key", reference)
	}
	hreq.Header.Set(SentAtHeader, strconv.FormatInt(time.Now().UnixNano(), 10))
	return c.do(hreq, out)
}

func (c *Client) newGet(ctx context.Context, path string) (*http.Request, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("acquirer: %w", err)
	}
	hreq.Header.Set("Accept", "application/json")
	return hreq, nil
}

// do sends hreq and decodes a 200 JSON answer into v. Any other status is a
// *StatusError. The body is drained so the connection can be reused.
func (c *Client) do(hreq *http.Request, v any) error {
	resp, err := c.http.Do(hreq)
	if err != nil {
		return err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
		_ = resp.Body.Close()
	}()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("reading the %d answer: %w", resp.StatusCode, err)
	}
	if len(body) > maxResponseBytes {
		return fmt.Errorf("the %d answer is larger than %d bytes", resp.StatusCode, maxResponseBytes)
	}
	if resp.StatusCode != http.StatusOK {
		se := &StatusError{StatusCode: resp.StatusCode}
		if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/problem+json" {
			_ = json.Unmarshal(body, &se.Problem)
		}
		return se
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" {
		return fmt.Errorf("the 200 answer is %q, not application/json", resp.Header.Get("Content-Type"))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decoding the 200 answer: %w", err)
	}
	return nil
}
