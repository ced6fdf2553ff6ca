package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/keyset"
)

// Settlement events are written by the trigger charges_webhook_event
// (migrations 0010 and 0011), for every charge that leaves processing, in
// the transaction that completes its record; the methods here manage
// endpoints and deliveries.

const endpointColumns = `id, merchant_id, url, description, status, coalesce(disabled_reason, ''),
	secret, coalesce(old_secret, ''), coalesce(old_secret_until, 0), created_at, coalesce(enabled_events, ''),
	coalesce(max_concurrency, 0)`

type scanner interface{ Scan(dest ...any) error }

func scanEndpoint(row scanner) (chargeonce.WebhookEndpoint, error) {
	var (
		e                   chargeonce.WebhookEndpoint
		status              string
		oldUntil, createdAt int64
		events              string
	)
	err := row.Scan(&e.ID, &e.MerchantID, &e.URL, &e.Description, &status, &e.DisabledReason,
		&e.Secret, &e.OldSecret, &oldUntil, &createdAt, &events, &e.MaxConcurrency)
	if err == nil && events != "" {
		err = json.Unmarshal([]byte(events), &e.EnabledEvents)
		if len(e.EnabledEvents) == 0 {
			e.EnabledEvents = nil
		}
	}
	e.Status = chargeonce.EndpointStatus(status)
	if oldUntil != 0 {
		e.OldSecretUntil = fromMicros(oldUntil)
	}
	e.CreatedAt = fromMicros(createdAt)
	return e, err
}

func notFound(what, id string) error {
	return chargeonce.Errorf(chargeonce.ENOTFOUND, "no %s %q", what, id)
}

// WebhookEndpointCreate inserts an enabled endpoint, unless its merchant
// has MaxWebhookEndpoints already: counted and inserted in one transaction
// of the single writer, so concurrent creates never exceed it.
func (s *Store) WebhookEndpointCreate(ctx context.Context, e chargeonce.WebhookEndpoint) (chargeonce.WebhookEndpoint, error) {
	var out chargeonce.WebhookEndpoint
	if e.MaxConcurrency != 0 {
		if err := chargeonce.CheckEndpointConcurrency(e.MaxConcurrency); err != nil {
			return out, err
		}
	}
	var conc any
	if e.MaxConcurrency != 0 {
		conc = e.MaxConcurrency
	}
	err := s.write(ctx, "creating webhook endpoint", func(ctx context.Context, tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM webhook_endpoints WHERE merchant_id = ?1`, e.MerchantID).Scan(&n); err != nil {
			return wrap("creating webhook endpoint", err)
		}
		if n >= chargeonce.MaxWebhookEndpoints {
			return chargeonce.FieldError("url", "a merchant may have at most %d webhook endpoints; delete one first", chargeonce.MaxWebhookEndpoints)
		}
		var err error
		out, err = scanEndpoint(tx.QueryRowContext(ctx, `
INSERT INTO webhook_endpoints (id, merchant_id, url, description, secret, created_at, enabled_events, max_concurrency)
VALUES (?1, ?2, ?3, ?4, ?5, `+nowMicros+`, ?6, ?7)
RETURNING `+endpointColumns, e.ID, e.MerchantID, e.URL, e.Description, e.Secret, eventsJSON(e.EnabledEvents), conc))
		if err != nil {
			return wrap("creating webhook endpoint", err)
		}
		return nil
	})
	if err != nil {
		return chargeonce.WebhookEndpoint{}, err
	}
	return out, nil
}

// eventsJSON stores event types as a JSON array, "every type" as NULL.
func eventsJSON(types []string) any {
	if len(types) == 0 {
		return nil
	}
	b, _ := json.Marshal(types) // []string always encodes
	return string(b)
}

// WebhookEndpointUpdate applies u in one transaction: disabling ends the
// endpoint's pending deliveries, enabling restarts its failure clock.
func (s *Store) WebhookEndpointUpdate(ctx context.Context, merchantID, id string, u chargeonce.WebhookEndpointUpdate) (chargeonce.WebhookEndpoint, error) {
	var out chargeonce.WebhookEndpoint
	var disabled any
	if u.Disabled != nil {
		disabled = *u.Disabled
	}
	setEvents, events := false, any(nil)
	if u.EnabledEvents != nil {
		setEvents, events = true, eventsJSON(*u.EnabledEvents)
	}
	var desc any
	if u.Description != nil {
		desc = *u.Description
	}
	var conc any
	if u.MaxConcurrency != nil {
		if err := chargeonce.CheckEndpointConcurrency(*u.MaxConcurrency); err != nil {
			return out, err
		}
		conc = *u.MaxConcurrency
	}
	err := s.write(ctx, "updating webhook endpoint", func(ctx context.Context, tx *sql.Tx) error {
		var err error
		out, err = scanEndpoint(tx.QueryRowContext(ctx, `
UPDATE webhook_endpoints SET
	status = CASE WHEN ?3 IS NULL THEN status WHEN ?3 THEN 'disabled' ELSE 'enabled' END,
	disabled_reason = CASE WHEN ?3 IS NULL THEN disabled_reason
		WHEN ?3 THEN CASE WHEN status = 'enabled' THEN 'disabled by the merchant' ELSE disabled_reason END
		ELSE NULL END,
	failing_since = CASE WHEN ?3 = 0 THEN NULL ELSE failing_since END,
	enabled_events = CASE WHEN ?4 THEN ?5 ELSE enabled_events END,
	description = coalesce(?6, description),
	max_concurrency = coalesce(?7, max_concurrency)
WHERE merchant_id = ?1 AND id = ?2
RETURNING `+endpointColumns, merchantID, id, disabled, setEvents, events, desc, conc))
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("webhook endpoint", id)
		}
		if err != nil {
			return wrap("updating webhook endpoint", err)
		}
		if out.Status == chargeonce.EndpointDisabled {
			if _, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET state = 'failed' WHERE endpoint_id = ?1 AND state = 'pending'`, id); err != nil {
				return wrap("updating webhook endpoint", err)
			}
		}
		return nil
	})
	return out, err
}

// WebhookEndpointRecover queues again the failed deliveries of the
// endpoint made since p.Since, the first p.Limit of them, once per event
// (see the PostgreSQL store), and restarts the endpoint's cooldown.
func (s *Store) WebhookEndpointRecover(ctx context.Context, p chargeonce.WebhookRecoverParams) (chargeonce.WebhookRecovered, error) {
	var out chargeonce.WebhookRecovered
	if p.Limit <= 0 {
		p.Limit = chargeonce.WebhookRecoverLimit
	}
	err := s.write(ctx, "recovering webhook deliveries", func(ctx context.Context, tx *sql.Tx) error {
		out = chargeonce.WebhookRecovered{}
		var (
			status string
			wait   int64 // microseconds of the cooldown left
		)
		err := tx.QueryRowContext(ctx, `SELECT status, coalesce(recovered_at + ?3 - `+nowMicros+`, 0)
FROM webhook_endpoints WHERE merchant_id = ?1 AND id = ?2`, p.MerchantID, p.EndpointID, p.Cooldown.Microseconds()).Scan(&status, &wait)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("webhook endpoint", p.EndpointID)
		}
		if err != nil {
			return wrap("recovering webhook deliveries", err)
		}
		if status != string(chargeonce.EndpointEnabled) {
			return chargeonce.Errorf(chargeonce.EINVALID, "webhook endpoint %s is disabled: enable it first", p.EndpointID)
		}
		if wait > 0 {
			return p.CooldownError(time.Duration(wait) * time.Microsecond)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE webhook_endpoints SET recovered_at = `+nowMicros+` WHERE id = ?1`, p.EndpointID); err != nil {
			return wrap("recovering webhook deliveries", err)
		}
		rows, err := tx.QueryContext(ctx, `SELECT d.event_id, d.created_at
FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
JOIN webhook_events ev ON ev.id = d.event_id
WHERE d.endpoint_id = ?1 AND d.state = 'failed' AND d.created_at >= ?2
	AND (e.enabled_events IS NULL OR EXISTS (SELECT 1 FROM json_each(e.enabled_events) WHERE value = ev.type))
	AND NOT EXISTS (SELECT 1 FROM webhook_deliveries o
		WHERE o.event_id = d.event_id AND o.endpoint_id = d.endpoint_id AND o.state = 'pending')
	AND NOT EXISTS (SELECT 1 FROM webhook_attempts a
		WHERE a.event_id = d.event_id AND a.endpoint_id = d.endpoint_id AND a.status_code BETWEEN 200 AND 299)
ORDER BY d.created_at, d.event_id
LIMIT ?3`, p.EndpointID, p.Since.UnixMicro(), p.Limit)
		if err != nil {
			return wrap("recovering webhook deliveries", err)
		}
		var (
			ids  []string
			read int
			last int64
		)
		for rows.Next() {
			var id string
			if err := rows.Scan(&id, &last); err != nil {
				rows.Close()
				return wrap("recovering webhook deliveries", err)
			}
			read++
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return wrap("recovering webhook deliveries", err)
		}
		for _, id := range ids {
			res, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, next_at, created_at)
VALUES (?1, ?2, ?3, `+nowMicros+`, `+nowMicros+`)
ON CONFLICT (event_id, endpoint_id) WHERE state = 'pending' DO NOTHING`, id, p.EndpointID, p.MerchantID)
			if err != nil {
				return wrap("recovering webhook deliveries", err)
			}
			if n, err := res.RowsAffected(); err == nil {
				out.Queued += int(n)
			}
		}
		if read >= p.Limit {
			out.HasMore, out.Next = true, time.UnixMicro(last)
		}
		return nil
	})
	return out, err
}

// WebhookEndpointsList returns the merchant's endpoints, oldest first.
func (s *Store) WebhookEndpointsList(ctx context.Context, merchantID string) ([]chargeonce.WebhookEndpoint, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+endpointColumns+`
FROM webhook_endpoints WHERE merchant_id = ?1 ORDER BY created_at, id`, merchantID)
	if err != nil {
		return nil, wrap("listing webhook endpoints", err)
	}
	defer rows.Close()
	out := []chargeonce.WebhookEndpoint{}
	for rows.Next() {
		e, err := scanEndpoint(rows)
		if err != nil {
			return nil, wrap("listing webhook endpoints", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing webhook endpoints", err)
	}
	return out, nil
}

// WebhookEndpointDelete removes the endpoint and its pending deliveries.
func (s *Store) WebhookEndpointDelete(ctx context.Context, merchantID, id string) error {
	return s.write(ctx, "deleting webhook endpoint", func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM webhook_endpoints WHERE merchant_id = ?1 AND id = ?2`, merchantID, id)
		if err != nil {
			return wrap("deleting webhook endpoint", err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err != nil {
				return wrap("deleting webhook endpoint", err)
			}
			return notFound("webhook endpoint", id)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE endpoint_id = ?1 AND state = 'pending'`, id); err != nil {
			return wrap("deleting webhook endpoint", err)
		}
		return nil
	})
}

// WebhookEndpointRotate swaps in a new secret; the old one signs for overlap.
func (s *Store) WebhookEndpointRotate(ctx context.Context, merchantID, id, secret string, overlap time.Duration) (chargeonce.WebhookEndpoint, error) {
	e, err := scanEndpoint(s.wdb.QueryRowContext(ctx, `
UPDATE webhook_endpoints
SET old_secret = secret, old_secret_until = `+nowMicros+` + ?4, secret = ?3
WHERE merchant_id = ?1 AND id = ?2
RETURNING `+endpointColumns, merchantID, id, secret, micros(overlap)))
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.WebhookEndpoint{}, notFound("webhook endpoint", id)
	}
	if err != nil {
		return chargeonce.WebhookEndpoint{}, wrap("rotating webhook secret", err)
	}
	return e, nil
}

func scanEvent(row scanner) (chargeonce.WebhookEvent, error) {
	var (
		ev chargeonce.WebhookEvent
		at int64
	)
	err := row.Scan(&ev.ID, &ev.MerchantID, &ev.ChargeID, &ev.ObjectID, &ev.Type, &at)
	ev.CreatedAt = fromMicros(at)
	return ev, err
}

// WebhookEventGet returns the event and its attempts.
func (s *Store) WebhookEventGet(ctx context.Context, merchantID, id string) (chargeonce.WebhookEvent, []chargeonce.WebhookAttempt, error) {
	ev, err := scanEvent(s.rdb.QueryRowContext(ctx, `SELECT id, merchant_id, charge_id, coalesce(object_id, ''), type, created_at
FROM webhook_events WHERE merchant_id = ?1 AND id = ?2`, merchantID, id))
	if errors.Is(err, sql.ErrNoRows) {
		return ev, nil, notFound("event", id)
	}
	if err != nil {
		return ev, nil, wrap("reading event", err)
	}
	attempts, err := s.attempts(ctx, `SELECT id, event_id, endpoint_id, at, coalesce(status_code, 0), coalesce(error, ''), latency_us
FROM (SELECT * FROM webhook_attempts WHERE event_id = ?1 ORDER BY id DESC LIMIT ?2) ORDER BY id`, id, chargeonce.EventAttemptsEmbedded)
	if err != nil {
		return ev, nil, wrap("reading event attempts", err)
	}
	return ev, attempts, nil
}

// attempts reads the attempts query q selects.
func (s *Store) attempts(ctx context.Context, q string, args ...any) ([]chargeonce.WebhookAttempt, error) {
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []chargeonce.WebhookAttempt{}
	for rows.Next() {
		var (
			a      chargeonce.WebhookAttempt
			at, us int64
		)
		if err := rows.Scan(&a.ID, &a.EventID, &a.EndpointID, &at, &a.StatusCode, &a.Error, &us); err != nil {
			return nil, err
		}
		a.At, a.Latency = fromMicros(at), time.Duration(us)*time.Microsecond
		out = append(out, a)
	}
	return out, rows.Err()
}

// WebhookAttemptsList pages the attempts of the merchant's event, newest
// first, by keyset on the attempt's id.
func (s *Store) WebhookAttemptsList(ctx context.Context, p chargeonce.AttemptsListParams) (chargeonce.AttemptsPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.AttemptsPage{}, err
	}
	var found int
	if err := s.rdb.QueryRowContext(ctx, `SELECT count(*) FROM webhook_events WHERE merchant_id = ?1 AND id = ?2`,
		p.MerchantID, p.EventID).Scan(&found); err != nil {
		return chargeonce.AttemptsPage{}, wrap("listing attempts", err)
	}
	if found == 0 {
		return chargeonce.AttemptsPage{}, notFound("event", p.EventID)
	}
	attempts, err := s.attempts(ctx, `SELECT id, event_id, endpoint_id, at, coalesce(status_code, 0), coalesce(error, ''), latency_us
FROM webhook_attempts WHERE event_id = ?1 AND (?2 = 0 OR id < ?2) ORDER BY id DESC LIMIT ?3`, p.EventID, p.StartingAfter, p.Limit+1)
	if err != nil {
		return chargeonce.AttemptsPage{}, wrap("listing attempts", err)
	}
	page := chargeonce.AttemptsPage{Attempts: attempts}
	if len(attempts) > p.Limit {
		page.Attempts, page.HasMore = attempts[:p.Limit], true
	}
	return page, nil
}

// WebhookEventsList pages the merchant's events, newest first, by keyset.
func (s *Store) WebhookEventsList(ctx context.Context, p chargeonce.EventsListParams) (chargeonce.EventsPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.EventsPage{}, err
	}
	page := chargeonce.EventsPage{Events: []chargeonce.WebhookEvent{}}
	var at int64
	if p.StartingAfter != "" {
		err := s.rdb.QueryRowContext(ctx, `SELECT created_at FROM webhook_events WHERE merchant_id = ?1 AND id = ?2`,
			p.MerchantID, p.StartingAfter).Scan(&at)
		if errors.Is(err, sql.ErrNoRows) {
			return page, chargeonce.FieldError("starting_after", "starting_after %q is not one of your events", p.StartingAfter)
		}
		if err != nil {
			return page, wrap("listing events", err)
		}
	}
	q, args := eventsPageSQL(p.MerchantID, p.ChargeID, at, p.StartingAfter, p.Limit+1)
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return page, wrap("listing events", err)
	}
	defer rows.Close()
	for rows.Next() {
		ev, err := scanEvent(rows)
		if err != nil {
			return page, wrap("listing events", err)
		}
		page.Events = append(page.Events, ev)
	}
	if err := rows.Err(); err != nil {
		return page, wrap("listing events", err)
	}
	page.Events, page.HasMore = keyset.Trim(page.Events, p.Limit, false)
	return page, nil
}

// WebhookEventRedeliver owes the event to every enabled endpoint, due now:
// a new delivery, or the one already pending made due (0013: at most one
// pending per event and endpoint).
func (s *Store) WebhookEventRedeliver(ctx context.Context, merchantID, id string) (int, error) {
	var n int64
	err := s.write(ctx, "redelivering event", func(ctx context.Context, tx *sql.Tx) error {
		var found int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM webhook_events WHERE merchant_id = ?1 AND id = ?2`,
			merchantID, id).Scan(&found); err != nil {
			return wrap("redelivering event", err)
		}
		if found == 0 {
			return notFound("event", id)
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, next_at, created_at)
SELECT ?2, e.id, e.merchant_id, `+nowMicros+`, `+nowMicros+`
FROM webhook_endpoints e WHERE e.merchant_id = ?1 AND e.status = 'enabled'
	AND (e.enabled_events IS NULL OR EXISTS (SELECT 1 FROM json_each(e.enabled_events) j
		WHERE j.value = (SELECT type FROM webhook_events WHERE id = ?2)))
ON CONFLICT (event_id, endpoint_id) WHERE state = 'pending'
DO UPDATE SET next_at = min(webhook_deliveries.next_at, excluded.next_at)`, merchantID, id)
		if err != nil {
			return wrap("redelivering event", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

// WebhookDeliveriesClaim claims due deliveries in one statement on the
// single writer, so two callers never get the same one while it is held.
// As on PostgreSQL, it reads each enabled endpoint's first due deliveries
// (webhook_deliveries_endpoint_due), so one endpoint's backlog does not
// slow the claim of another's.
func (s *Store) WebhookDeliveriesClaim(ctx context.Context, lease time.Duration, limit, perMerchant int, skip []string) ([]chargeonce.WebhookDelivery, error) {
	if limit <= 0 || perMerchant <= 0 {
		return nil, nil
	}
	if skip == nil {
		skip = []string{}
	}
	skipJSON, err := json.Marshal(skip)
	if err != nil {
		return nil, wrap("claiming webhook deliveries", err)
	}
	token := idempotency.NewToken()
	var out []chargeonce.WebhookDelivery
	err = s.write(ctx, "claiming webhook deliveries", func(ctx context.Context, tx *sql.Tx) error {
		out = out[:0]
		rows, err := tx.QueryContext(ctx, `UPDATE webhook_deliveries SET claimed_until = `+nowMicros+` + ?1, token = ?4
WHERE id IN (
	SELECT id FROM (
		SELECT p.id, p.next_at, row_number() OVER (PARTITION BY e.merchant_id ORDER BY p.next_at, p.id) AS rn
		FROM webhook_endpoints e
		JOIN webhook_deliveries p ON p.id IN (
			SELECT d.id FROM webhook_deliveries d INDEXED BY webhook_deliveries_endpoint_due
			WHERE d.endpoint_id = e.id AND d.state = 'pending' AND d.next_at <= `+nowMicros+` AND d.claimed_until <= `+nowMicros+`
			ORDER BY d.next_at, d.id LIMIT ?3)
		WHERE e.status = 'enabled' AND e.merchant_id NOT IN (SELECT value FROM json_each(?5))
	) WHERE rn <= ?3 ORDER BY next_at, id LIMIT ?2)
RETURNING id, attempts, event_id, endpoint_id`, micros(lease), limit, perMerchant, token, string(skipJSON))
		if err != nil {
			return wrap("claiming webhook deliveries", err)
		}
		type claimed struct {
			id                  int64
			attempts            int
			eventID, endpointID string
		}
		var cs []claimed
		for rows.Next() {
			var c claimed
			if err := rows.Scan(&c.id, &c.attempts, &c.eventID, &c.endpointID); err != nil {
				rows.Close()
				return wrap("claiming webhook deliveries", err)
			}
			cs = append(cs, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return wrap("claiming webhook deliveries", err)
		}
		for _, c := range cs {
			d := chargeonce.WebhookDelivery{ID: c.id, Token: token, Attempts: c.attempts}
			ev, err := scanEvent(tx.QueryRowContext(ctx, `SELECT id, merchant_id, charge_id, coalesce(object_id, ''), type, created_at
FROM webhook_events WHERE id = ?1`, c.eventID))
			if err != nil {
				return wrap("claiming webhook deliveries", err)
			}
			e, err := scanEndpoint(tx.QueryRowContext(ctx, `SELECT `+endpointColumns+` FROM webhook_endpoints WHERE id = ?1`, c.endpointID))
			if errors.Is(err, sql.ErrNoRows) {
				continue // the endpoint was deleted
			}
			if err != nil {
				return wrap("claiming webhook deliveries", err)
			}
			d.Event, d.Endpoint = ev, e
			out = append(out, d)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// WebhookDeliveryFinish records the attempt, settles the delivery under its
// claim and keeps the endpoint's failure clock, in one transaction.
func (s *Store) WebhookDeliveryFinish(ctx context.Context, d chargeonce.WebhookDelivery, o chargeonce.WebhookOutcome) (bool, error) {
	a := o.Attempt
	var (
		errText any
		code    any
	)
	if a.Error != "" {
		errText = a.Error
	}
	if a.StatusCode != 0 {
		code = a.StatusCode
	}
	state, next := o.DeliveryState()
	var claimed, disabled bool
	err := s.write(ctx, "finishing webhook delivery", func(ctx context.Context, tx *sql.Tx) error {
		claimed, disabled = false, false
		if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_attempts (event_id, endpoint_id, at, status_code, error, latency_us)
VALUES (?1, ?2, `+nowMicros+`, ?3, ?4, ?5)`, d.Event.ID, d.Endpoint.ID, code, errText, a.Latency.Microseconds()); err != nil {
			return wrap("recording webhook attempt", err)
		}
		res, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries
SET state = ?3, attempts = attempts + 1, next_at = `+nowMicros+` + ?4, claimed_until = 0
WHERE id = ?1 AND token = ?2 AND state = 'pending'`, d.ID, d.Token, state, micros(next))
		if err != nil {
			return wrap("finishing webhook delivery", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("finishing webhook delivery", err)
		}
		claimed = n == 1
		if o.Delivered {
			if _, err := tx.ExecContext(ctx, `UPDATE webhook_endpoints SET failing_since = NULL WHERE id = ?1 AND failing_since IS NOT NULL`, d.Endpoint.ID); err != nil {
				return wrap("finishing webhook delivery", err)
			}
			return nil
		}
		var (
			status      string
			failingLong bool
			reason      string
		)
		err = tx.QueryRowContext(ctx, `SELECT status,
	failing_since IS NOT NULL AND `+nowMicros+` - failing_since >= ?2
FROM webhook_endpoints WHERE id = ?1`, d.Endpoint.ID, o.DisableAfter.Microseconds()).Scan(&status, &failingLong)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return wrap("finishing webhook delivery", err)
		}
		disabled, reason = o.Disables(chargeonce.EndpointStatus(status), failingLong)
		if _, err := tx.ExecContext(ctx, `UPDATE webhook_endpoints SET failing_since = coalesce(failing_since, `+nowMicros+`),
	status = CASE WHEN ?2 THEN 'disabled' ELSE status END,
	disabled_reason = CASE WHEN ?2 THEN ?3 ELSE disabled_reason END
WHERE id = ?1`, d.Endpoint.ID, disabled, reason); err != nil {
			return wrap("finishing webhook delivery", err)
		}
		if disabled {
			if _, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET state = 'failed'
WHERE endpoint_id = ?1 AND state = 'pending' AND id <> ?2`, d.Endpoint.ID, d.ID); err != nil {
				return wrap("finishing webhook delivery", err)
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if !claimed {
		return disabled, chargeonce.Errorf(chargeonce.ESTALE, "webhook delivery %d is no longer held by this sender", d.ID)
	}
	return disabled, nil
}

// WebhookDeliveriesFinish records the delivered ones of fs in one write
// transaction, the others one by one (WebhookDeliveryFinish).
func (s *Store) WebhookDeliveriesFinish(ctx context.Context, fs []chargeonce.WebhookFinish) {
	var idx []int
	for i := range fs {
		f := &fs[i]
		if f.Outcome.Delivered {
			idx = append(idx, i)
			continue
		}
		f.Disabled, f.Err = s.WebhookDeliveryFinish(ctx, f.Delivery, f.Outcome)
	}
	if len(idx) == 0 {
		return
	}
	ended := make([]bool, len(idx))
	err := s.write(ctx, "finishing webhook deliveries", func(ctx context.Context, tx *sql.Tx) error {
		clear(ended)
		endpoints := map[string]bool{}
		for j, i := range idx {
			d, a := fs[i].Delivery, fs[i].Outcome.Attempt
			if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_attempts (event_id, endpoint_id, at, status_code, latency_us)
VALUES (?1, ?2, `+nowMicros+`, ?3, ?4)`, d.Event.ID, d.Endpoint.ID, a.StatusCode, a.Latency.Microseconds()); err != nil {
				return wrap("recording webhook attempt", err)
			}
			res, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries
SET state = 'succeeded', attempts = attempts + 1, next_at = `+nowMicros+`, claimed_until = 0
WHERE id = ?1 AND token = ?2 AND state = 'pending'`, d.ID, d.Token)
			if err != nil {
				return wrap("finishing webhook delivery", err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return wrap("finishing webhook delivery", err)
			}
			ended[j] = n == 1
			endpoints[d.Endpoint.ID] = true
		}
		for id := range endpoints {
			if _, err := tx.ExecContext(ctx, `UPDATE webhook_endpoints SET failing_since = NULL WHERE id = ?1 AND failing_since IS NOT NULL`, id); err != nil {
				return wrap("finishing webhook delivery", err)
			}
		}
		return nil
	})
	for j, i := range idx {
		switch {
		case err != nil:
			fs[i].Err = err
		case !ended[j]:
			fs[i].Err = chargeonce.Errorf(chargeonce.ESTALE, "webhook delivery %d is no longer held by this sender", fs[i].Delivery.ID)
		}
	}
}

// WebhookStats counts pending deliveries and disabled endpoints.
func (s *Store) WebhookStats(ctx context.Context) (chargeonce.WebhookStats, error) {
	var (
		st  chargeonce.WebhookStats
		age int64
	)
	err := s.rdb.QueryRowContext(ctx, `SELECT
	(SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'),
	coalesce((SELECT `+nowMicros+` - min(created_at) FROM webhook_deliveries WHERE state = 'pending'), 0),
	(SELECT count(*) FROM webhook_endpoints WHERE status = 'disabled')`).Scan(&st.Pending, &age, &st.EndpointsDisabled)
	if err != nil {
		return st, wrap("counting webhook deliveries", err)
	}
	st.OldestPendingAge = time.Duration(age) * time.Microsecond
	return st, nil
}

// eventsPageSQL is a page of the merchant's events, newest first, and its
// arguments: see keyset.Where. A charge's events are few, and read through its
// index: the merchant's index gives them in order, and SQLite chose it,
// walking the merchant's whole history for them.
func eventsPageSQL(merchantID, chargeID string, at int64, cursor string, limit int) (string, []any) {
	where, args := keyset.Where("?", merchantID, chargeID, at, cursor, limit)
	from := "webhook_events"
	if chargeID != "" {
		from = "webhook_events INDEXED BY webhook_events_charge"
	}
	return `SELECT id, merchant_id, charge_id, coalesce(object_id, ''), type, created_at
FROM ` + from + ` WHERE ` + where + ` ORDER BY created_at DESC, id DESC LIMIT ?2`, args
}
