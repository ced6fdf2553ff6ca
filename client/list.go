package client

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strconv"
)

// ListParams select a page of the merchant's charges (GET /v1/charges).
// Zero values leave a parameter out: the server's default limit (10), no
// cursor, every order and status.
type ListParams struct {
	// OrderID keeps only the charges of one order. More than one captured
	// charge for one order is what a double charge looks like.
	OrderID int64
	// Status keeps only the charges in one state (StatusProcessing,
	// StatusCaptured, StatusDeclined).
	Status string
	// Limit is the most charges a page holds, 1 to 100.
	Limit int
	// StartingAfter, a charge id, asks for the charges older than it: the
	// next page after a page whose last charge it is.
	StartingAfter string
	// EndingBefore, a charge id, asks for the charges newer than it (the
	// previous page), still newest first. Not with StartingAfter.
	EndingBefore string
}

func (p ListParams) query() string {
	q := url.Values{}
	if p.OrderID != 0 {
		q.Set("order_id", strconv.FormatInt(p.OrderID, 10))
	}
	if p.Status != "" {
		q.Set("status", p.Status)
	}
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.StartingAfter != "" {
		q.Set("starting_after", p.StartingAfter)
	}
	if p.EndingBefore != "" {
		q.Set("ending_before", p.EndingBefore)
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// ChargePage is one page of charges, newest first.
type ChargePage struct {
	Charges []Charge `json:"data"`
	// HasMore tells whether more charges lie beyond this page: older ones,
	// or newer ones when the page was asked for with EndingBefore.
	HasMore bool `json:"has_more"`
}

// ListCharges returns one page of the merchant's charges, newest first.
// To see them all, follow HasMore with StartingAfter set to the last
// charge's id, or range over AllCharges. A mistake in p is a
// *ValidationError whose Problem.Field names the parameter.
func (c *Client) ListCharges(ctx context.Context, p ListParams) (*ChargePage, error) {
	ex, n, err := c.run(ctx, call{method: http.MethodGet, path: "/v1/charges" + p.query()})
	if err != nil {
		return nil, err
	}
	if ex.status != http.StatusOK {
		return nil, responseError(ex, n)
	}
	var page ChargePage
	if err := json.Unmarshal(ex.body, &page); err != nil {
		return nil, &finalError{fmt.Errorf("chargeonce: decoding the charge list: %w", err), n}
	}
	for i := range page.Charges {
		page.Charges[i].Attempts = n
	}
	if page.Charges == nil {
		page.Charges = []Charge{}
	}
	return &page, nil
}

// AllCharges yields the merchant's charges that p selects, newest first,
// fetching one page per request as the loop needs it. With p.EndingBefore
// it walks the other way: the charges newer than that one, oldest first. An error ends the sequence: it is
// yielded once, with a zero Charge. Charges created during the walk that
// are newer than its first page are not listed; none is listed twice.
//
//	for ch, err := range c.AllCharges(ctx, client.ListParams{OrderID: 42}) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(ch.ID, ch.Status)
//	}
func (c *Client) AllCharges(ctx context.Context, p ListParams) iter.Seq2[Charge, error] {
	return func(yield func(Charge, error) bool) {
		for {
			page, err := c.ListCharges(ctx, p)
			if err != nil {
				yield(Charge{}, err)
				return
			}
			if p.EndingBefore != "" {
				// Walking toward the newest: each page is newest first,
				// and the next one lies before its first charge.
				for i := len(page.Charges) - 1; i >= 0; i-- {
					if !yield(page.Charges[i], nil) {
						return
					}
				}
				if !page.HasMore || len(page.Charges) == 0 {
					return
				}
				p.EndingBefore = page.Charges[0].ID
				continue
			}
			for _, ch := range page.Charges {
				if !yield(ch, nil) {
					return
				}
			}
			if !page.HasMore || len(page.Charges) == 0 {
				return
			}
			p.StartingAfter = page.Charges[len(page.Charges)-1].ID
		}
	}
}
