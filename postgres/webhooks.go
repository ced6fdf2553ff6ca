package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/keyset"
)

const endpointColumns = `id, merchant_id, url, description, status, COALESCE(disabled_reason, ''),
	secret, COALESCE(old_secret, ''), old_secret_until, created_at, enabled_events, COALESCE(max_concurrency, 0)`

func scanEndpoint(row pgx.Row) (chargeonce.WebhookEndpoint, error) {
	var (
		e        chargeonce.WebhookEndpoint
		status   string
		oldUntil *time.Time
	)
	err := row.Scan(&e.ID, &e.MerchantID, &e.URL, &e.Description, &status, &e.DisabledReason,
		&e.Secret, &e.OldSecret, &oldUntil, &e.CreatedAt, &e.EnabledEvents, &e.MaxConcurrency)
	if len(e.EnabledEvents) == 0 {
		e.EnabledEvents = nil
	}
	e.Status = chargeonce.EndpointStatus(status)
	if oldUntil != nil {
		e.OldSecretUntil = *oldUntil
	}
	return e, err
}

func notFound(what, id string) error {
	return chargeonce.Errorf(chargeonce.ENOTFOUND, "no %s %q", what, id)
}

// WebhookEndpointCreate inserts an enabled endpoint, unless its merchant
// has MaxWebhookEndpoints already. The count and the insert run under a
// transaction lock on the merchant's endpoints, so concurrent creates take
// turns: under READ COMMITTED each would otherwise count without seeing
// the others' rows (64 concurrent creates made 35 endpoints against 16).
func (s *Store) WebhookEndpointCreate(ctx context.Context, e chargeonce.WebhookEndpoint) (chargeonce.WebhookEndpoint, error) {
	var out chargeonce.WebhookEndpoint
	if e.MaxConcurrency != 0 {
		if err := chargeonce.CheckEndpointConcurrency(e.MaxConcurrency); err != nil {
			return out, err
		}
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The count is a statement of its own, after the lock: a statement
		// reads the snapshot taken when it began, which would not show the
		// rows of the create the lock waited for (21 endpoints against 16).
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('chargeonce.webhook_endpoints/' || $1, 0))`, e.MerchantID); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE merchant_id = $1`, e.MerchantID).Scan(&n); err != nil {
			return err
		}
		if n >= chargeonce.MaxWebhookEndpoints {
			return endpointCapError()
		}
		var err error
		out, err = scanEndpoint(tx.QueryRow(ctx, `
INSERT INTO webhook_endpoints (id, merchant_id, url, description, secret, enabled_events, max_concurrency)
VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, 0))
RETURNING `+endpointColumns, e.ID, e.MerchantID, e.URL, e.Description, e.Secret, nilIfEmpty(e.EnabledEvents), e.MaxConcurrency))
		return err
	})
	if chargeonce.ErrorCode(err) == chargeonce.EINVALID {
		return chargeonce.WebhookEndpoint{}, err
	}
	if err != nil {
		return chargeonce.WebhookEndpoint{}, fmt.Errorf("creating webhook endpoint: %w", translate(err))
	}
	return out, nil
}

// nilIfEmpty stores "every event type" as NULL.
func nilIfEmpty(types []string) []string {
	if len(types) == 0 {
		return nil
	}
	return types
}

// WebhookEndpointUpdate applies u in one transaction: disabling ends the
// endpoint's pending deliveries, enabling restarts its failure clock.
func (s *Store) WebhookEndpointUpdate(ctx context.Context, merchantID, id string, u chargeonce.WebhookEndpointUpdate) (chargeonce.WebhookEndpoint, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return chargeonce.WebhookEndpoint{}, notFound("webhook endpoint", id)
	}
	var (
		out       chargeonce.WebhookEndpoint
		setEvents bool
		events    []string
	)
	if u.EnabledEvents != nil {
		setEvents, events = true, nilIfEmpty(*u.EnabledEvents)
	}
	if u.MaxConcurrency != nil {
		if err := chargeonce.CheckEndpointConcurrency(*u.MaxConcurrency); err != nil {
			return out, err
		}
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = scanEndpoint(tx.QueryRow(ctx, `
UPDATE webhook_endpoints SET
	status = CASE WHEN $3::boolean IS NULL THEN status WHEN $3 THEN 'disabled' ELSE 'enabled' END,
	disabled_reason = CASE WHEN $3::boolean IS NULL THEN disabled_reason
		WHEN $3 THEN CASE WHEN status = 'enabled' THEN 'disabled by the merchant' ELSE disabled_reason END
		ELSE NULL END,
	failing_since = CASE WHEN $3 = false THEN NULL ELSE failing_since END,
	enabled_events = CASE WHEN $4 THEN $5::text[] ELSE enabled_events END,
	description = COALESCE($6, description),
	max_concurrency = COALESCE($7, max_concurrency)
WHERE merchant_id = $1 AND id = $2
RETURNING `+endpointColumns, merchantID, id, u.Disabled, setEvents, events, u.Description, u.MaxConcurrency))
		if err != nil {
			return err
		}
		if out.Status == chargeonce.EndpointDisabled {
			_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET state = 'failed' WHERE endpoint_id = $1 AND state = 'pending'`, id)
		}
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.WebhookEndpoint{}, notFound("webhook endpoint", id)
	}
	if err != nil {
		return chargeonce.WebhookEndpoint{}, fmt.Errorf("updating webhook endpoint: %w", translate(err))
	}
	return out, nil
}

// WebhookEndpointRecover queues again the failed deliveries of the
// endpoint made since p.Since, the first p.Limit of them in the order of
// webhook_deliveries_endpoint_failed, once per event: an event the
// endpoint received since (a 2xx attempt), still owes or no longer asks
// for (enabled_events) is passed over. One statement: the endpoint's row
// is taken first (its cooldown checked and restarted), then deliveries are
// written, the order a disable and a sender's finish take them in too.
func (s *Store) WebhookEndpointRecover(ctx context.Context, p chargeonce.WebhookRecoverParams) (chargeonce.WebhookRecovered, error) {
	var out chargeonce.WebhookRecovered
	if !chargeonce.ValidText(p.MerchantID) || !chargeonce.ValidText(p.EndpointID) {
		return out, notFound("webhook endpoint", p.EndpointID)
	}
	if p.Limit <= 0 {
		p.Limit = chargeonce.WebhookRecoverLimit
	}
	var (
		status    *string
		took      bool
		wait      time.Duration
		read      int
		lastAfter *time.Time
	)
	err := s.pool.QueryRow(ctx, `
WITH cur AS (
	SELECT status, recovered_at FROM webhook_endpoints WHERE merchant_id = $1 AND id = $2
), e AS (
	UPDATE webhook_endpoints SET recovered_at = now()
	WHERE merchant_id = $1 AND id = $2 AND status = 'enabled'
		AND (recovered_at IS NULL OR recovered_at <= now() - $5::bigint * interval '1 microsecond')
	RETURNING id, merchant_id, enabled_events
), f AS (
	SELECT d.event_id, d.created_at
	FROM e JOIN webhook_deliveries d ON d.endpoint_id = e.id AND d.state = 'failed' AND d.created_at >= $3
	JOIN webhook_events ev ON ev.id = d.event_id
	WHERE (e.enabled_events IS NULL OR ev.type = ANY (e.enabled_events))
		AND NOT EXISTS (SELECT FROM webhook_deliveries o
			WHERE o.event_id = d.event_id AND o.endpoint_id = d.endpoint_id AND o.state = 'pending')
		AND NOT EXISTS (SELECT FROM webhook_attempts a
			WHERE a.event_id = d.event_id AND a.endpoint_id = d.endpoint_id AND a.status_code BETWEEN 200 AND 299)
	ORDER BY d.created_at, d.event_id
	LIMIT $4
), q AS (
	INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id)
	SELECT DISTINCT f.event_id, e.id, e.merchant_id FROM f CROSS JOIN e
	ON CONFLICT (event_id, endpoint_id) WHERE state = 'pending' DO NOTHING
	RETURNING 1
)
SELECT (SELECT status FROM cur), EXISTS (SELECT FROM e),
	COALESCE(GREATEST((SELECT recovered_at FROM cur) + $5::bigint * interval '1 microsecond' - now(), interval '0'), interval '0'),
	(SELECT count(*) FROM q), (SELECT count(*) FROM f), (SELECT max(created_at) FROM f)`,
		p.MerchantID, p.EndpointID, p.Since, p.Limit, p.Cooldown.Microseconds()).Scan(&status, &took, &wait, &out.Queued, &read, &lastAfter)
	if err != nil {
		return out, fmt.Errorf("recovering webhook deliveries: %w", translate(err))
	}
	switch {
	case status == nil:
		return out, notFound("webhook endpoint", p.EndpointID)
	case *status != string(chargeonce.EndpointEnabled):
		return out, chargeonce.Errorf(chargeonce.EINVALID, "webhook endpoint %s is disabled: enable it first", p.EndpointID)
	case !took:
		return out, p.CooldownError(wait)
	}
	if read >= p.Limit && lastAfter != nil {
		out.HasMore, out.Next = true, *lastAfter
	}
	return out, nil
}

func endpointCapError() error {
	return chargeonce.FieldError("url", "a merchant may have at most %d webhook endpoints; delete one first", chargeonce.MaxWebhookEndpoints)
}

// WebhookEndpointsList returns the merchant's endpoints, oldest first.
func (s *Store) WebhookEndpointsList(ctx context.Context, merchantID string) ([]chargeonce.WebhookEndpoint, error) {
	if !chargeonce.ValidText(merchantID) {
		return []chargeonce.WebhookEndpoint{}, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+endpointColumns+`
FROM webhook_endpoints WHERE merchant_id = $1 ORDER BY created_at, id`, merchantID)
	if err != nil {
		return nil, fmt.Errorf("listing webhook endpoints: %w", translate(err))
	}
	defer rows.Close()
	out := []chargeonce.WebhookEndpoint{}
	for rows.Next() {
		e, err := scanEndpoint(rows)
		if err != nil {
			return nil, fmt.Errorf("listing webhook endpoints: %w", translate(err))
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing webhook endpoints: %w", translate(err))
	}
	return out, nil
}

// WebhookEndpointDelete removes the endpoint and its pending deliveries in
// one statement.
func (s *Store) WebhookEndpointDelete(ctx context.Context, merchantID, id string) error {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return notFound("webhook endpoint", id)
	}
	var n int
	err := s.pool.QueryRow(ctx, `
WITH e AS (
	DELETE FROM webhook_endpoints WHERE merchant_id = $1 AND id = $2 RETURNING id
), d AS (
	DELETE FROM webhook_deliveries WHERE endpoint_id IN (SELECT id FROM e) AND state = 'pending'
)
SELECT count(*) FROM e`, merchantID, id).Scan(&n)
	if err != nil {
		return fmt.Errorf("deleting webhook endpoint: %w", translate(err))
	}
	if n == 0 {
		return notFound("webhook endpoint", id)
	}
	return nil
}

// WebhookEndpointRotate swaps in a new secret; the old one signs for overlap.
func (s *Store) WebhookEndpointRotate(ctx context.Context, merchantID, id, secret string, overlap time.Duration) (chargeonce.WebhookEndpoint, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return chargeonce.WebhookEndpoint{}, notFound("webhook endpoint", id)
	}
	e, err := scanEndpoint(s.pool.QueryRow(ctx, `
UPDATE webhook_endpoints
SET old_secret = secret, old_secret_until = now() + $4::interval, secret = $3
WHERE merchant_id = $1 AND id = $2
RETURNING `+endpointColumns, merchantID, id, secret, overlap))
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.WebhookEndpoint{}, notFound("webhook endpoint", id)
	}
	if err != nil {
		return chargeonce.WebhookEndpoint{}, fmt.Errorf("rotating webhook secret: %w", translate(err))
	}
	return e, nil
}

// WebhookEventGet returns the event and its attempts.
func (s *Store) WebhookEventGet(ctx context.Context, merchantID, id string) (chargeonce.WebhookEvent, []chargeonce.WebhookAttempt, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return chargeonce.WebhookEvent{}, nil, notFound("event", id)
	}
	var ev chargeonce.WebhookEvent
	err := s.pool.QueryRow(ctx, `SELECT id, merchant_id, charge_id, coalesce(object_id, ''), type, created_at
FROM webhook_events WHERE id = $1`, id). // byID
		Scan(&ev.ID, &ev.MerchantID, &ev.ChargeID, &ev.ObjectID, &ev.Type, &ev.CreatedAt)
	if notTheirs(err, ev.MerchantID, merchantID) {
		return ev, nil, notFound("event", id)
	}
	if err != nil {
		return ev, nil, fmt.Errorf("reading event: %w", translate(err))
	}
	attempts, err := s.attempts(ctx, `SELECT id, event_id, endpoint_id, at, COALESCE(status_code, 0), COALESCE(error, ''), latency_us
FROM (SELECT * FROM webhook_attempts WHERE event_id = $1 ORDER BY id DESC LIMIT $2) a ORDER BY id`, id, chargeonce.EventAttemptsEmbedded)
	if err != nil {
		return ev, nil, fmt.Errorf("reading event attempts: %w", err)
	}
	return ev, attempts, nil
}

// attempts reads the attempts query q selects.
func (s *Store) attempts(ctx context.Context, q string, args ...any) ([]chargeonce.WebhookAttempt, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	out := []chargeonce.WebhookAttempt{}
	for rows.Next() {
		var (
			a  chargeonce.WebhookAttempt
			us int64
		)
		if err := rows.Scan(&a.ID, &a.EventID, &a.EndpointID, &a.At, &a.StatusCode, &a.Error, &us); err != nil {
			return nil, translate(err)
		}
		a.Latency = time.Duration(us) * time.Microsecond
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, translate(err)
	}
	return out, nil
}

// WebhookAttemptsList pages the attempts of the merchant's event, newest
// first, by keyset on the attempt's id.
func (s *Store) WebhookAttemptsList(ctx context.Context, p chargeonce.AttemptsListParams) (chargeonce.AttemptsPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.AttemptsPage{}, err
	}
	if !chargeonce.ValidText(p.MerchantID) || !chargeonce.ValidText(p.EventID) {
		return chargeonce.AttemptsPage{}, notFound("event", p.EventID)
	}
	var found bool
	if err := s.pool.QueryRow(ctx, `SELECT COALESCE((SELECT merchant_id = $1 FROM webhook_events WHERE id = $2), false)`, // byID
		p.MerchantID, p.EventID).Scan(&found); err != nil {
		return chargeonce.AttemptsPage{}, fmt.Errorf("listing attempts: %w", translate(err))
	}
	if !found {
		return chargeonce.AttemptsPage{}, notFound("event", p.EventID)
	}
	attempts, err := s.attempts(ctx, `SELECT id, event_id, endpoint_id, at, COALESCE(status_code, 0), COALESCE(error, ''), latency_us
FROM webhook_attempts WHERE event_id = $1 AND ($2 = 0 OR id < $2) ORDER BY id DESC LIMIT $3`, p.EventID, p.StartingAfter, p.Limit+1)
	if err != nil {
		return chargeonce.AttemptsPage{}, fmt.Errorf("listing attempts: %w", err)
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
	if !chargeonce.ValidText(p.MerchantID) || !chargeonce.ValidText(p.ChargeID) {
		return page, nil
	}
	var (
		at     time.Time
		cursor = p.StartingAfter
	)
	if cursor != "" {
		var owner string
		err := s.pool.QueryRow(ctx, `SELECT created_at, merchant_id FROM webhook_events WHERE id = $1`,
			cursor).Scan(&at, &owner) // byID
		if notTheirs(err, owner, p.MerchantID) || (err == nil && !chargeonce.ValidText(cursor)) {
			return page, chargeonce.FieldError("starting_after", "starting_after %q is not one of your events", cursor)
		}
		if err != nil {
			return page, fmt.Errorf("listing events: %w", translate(err))
		}
	}
	where, args := keyset.Where("$", p.MerchantID, p.ChargeID, at, cursor, p.Limit+1)
	from := "webhook_events"
	if p.ChargeID != "" {
		// A charge's events are few, and its index (charge_id) gives them in
		// no order: walking the merchant's index for them, which a LIMIT
		// makes look cheap, read the merchant's whole history (2,143 index
		// blocks a page with 100,000 events).
		from = "(SELECT * FROM webhook_events WHERE charge_id = $3 OFFSET 0) ev"
	}
	rows, err := s.pool.Query(ctx, `SELECT id, merchant_id, charge_id, coalesce(object_id, ''), type, created_at
FROM `+from+` WHERE `+where+` ORDER BY created_at DESC, id DESC LIMIT $2`, args...)
	if err != nil {
		return page, fmt.Errorf("listing events: %w", translate(err))
	}
	defer rows.Close()
	for rows.Next() {
		var ev chargeonce.WebhookEvent
		if err := rows.Scan(&ev.ID, &ev.MerchantID, &ev.ChargeID, &ev.ObjectID, &ev.Type, &ev.CreatedAt); err != nil {
			return page, fmt.Errorf("listing events: %w", translate(err))
		}
		page.Events = append(page.Events, ev)
	}
	if err := rows.Err(); err != nil {
		return page, fmt.Errorf("listing events: %w", translate(err))
	}
	page.Events, page.HasMore = keyset.Trim(page.Events, p.Limit, false)
	return page, nil
}

// WebhookEventRedeliver owes the event to every enabled endpoint, due now:
// a new delivery, or the one already pending made due.
func (s *Store) WebhookEventRedeliver(ctx context.Context, merchantID, id string) (int, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return 0, notFound("event", id)
	}
	var found bool
	var n int
	err := s.pool.QueryRow(ctx, `
WITH ev AS MATERIALIZED ( -- byID: by id alone, then the owner
	SELECT id, merchant_id, type FROM webhook_events WHERE id = $2
), mine AS (
	SELECT * FROM ev WHERE merchant_id = $1
), d AS (
	INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id)
	SELECT ev.id, e.id, ev.merchant_id FROM mine ev
	JOIN webhook_endpoints e ON e.merchant_id = ev.merchant_id AND e.status = 'enabled'
		AND (e.enabled_events IS NULL OR ev.type = ANY (e.enabled_events))
	-- At most one pending delivery per event and endpoint (0013): one
	-- already owed is made due now instead.
	ON CONFLICT (event_id, endpoint_id) WHERE state = 'pending'
	DO UPDATE SET next_at = LEAST(webhook_deliveries.next_at, now())
	RETURNING id
)
SELECT EXISTS (SELECT FROM mine), (SELECT count(*) FROM d)`, merchantID, id).Scan(&found, &n)
	if err != nil {
		return 0, fmt.Errorf("redelivering event: %w", translate(err))
	}
	if !found {
		return 0, notFound("event", id)
	}
	return n, nil
}

// DeliveryMaxConns is the size of the webhook sender's own pool: its
// claims, its records of attempts and its counts run there, never waiting
// behind charges for the main pool's connections, and never taking one
// from them (a sender claims and records one batch at a time: two are
// enough). Under bench --webhooks at 64 clients, sharing the main pool of
// 10, deliveries ran at 0.3-0.5 x the settlements while the load ran, and
// at 675 a second once it stopped.
const DeliveryMaxConns = 2

// deliveryPool is the sender's pool, opened on first use from the main
// pool's configuration; the main pool if it cannot be.
//
// On a connection of its own (no pooler) its sessions commit without
// waiting for the WAL flush (synchronous_commit = off): what they write is
// the senders' bookkeeping (claims, attempts, the endpoints' failure
// clocks), never money, and deliveries are at least once (SPEC), so a
// commit lost to a crash of PostgreSQL within the WAL writer's delay costs
// a delivery sent again, which receivers deduplicate by webhook-id. The
// settlements' events and deliveries themselves are written by the
// charges' own transactions, as durable as the charge. Behind a pooler a
// session setting would reach other clients' transactions, so there the
// sender's commits wait as every other's.
func (s *Store) deliveryPool() *pgxpool.Pool {
	s.deliveriesOnce.Do(func() {
		cfg := s.pool.Config()
		cfg.MaxConns, cfg.MinConns = DeliveryMaxConns, 0
		if !s.pooled {
			after := cfg.AfterConnect
			cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
				if after != nil {
					if err := after(ctx, c); err != nil {
						return err
					}
				}
				_, err := c.Exec(ctx, "SET synchronous_commit = off")
				return err
			}
		}
		if p, err := pgxpool.NewWithConfig(context.Background(), cfg); err == nil {
			s.deliveries = p
		}
	})
	if s.deliveries == nil {
		return s.pool
	}
	return s.deliveries
}

func (s *Store) closeDeliveryPool() {
	s.deliveriesOnce.Do(func() {}) // none opened from now on
	if s.deliveries != nil {
		s.deliveries.Close()
	}
}

// WebhookDeliveriesClaim picks due deliveries, at most perMerchant of a
// merchant, and claims them. The pick walks the enabled endpoints of the
// merchants not skipped and reads each one's first due deliveries from
// webhook_deliveries_endpoint_due (0013): its cost grows with the number
// of endpoints, never with how many deliveries one of them has waiting (a
// pick in next_at order over the whole queue scanned past every row of a
// merchant held at its limit). It reads without locks (a window function
// cannot take FOR UPDATE); the UPDATE re-checks each row's claim once it
// holds the row lock, so two senders never claim one delivery.
func (s *Store) WebhookDeliveriesClaim(ctx context.Context, lease time.Duration, limit, perMerchant int, skip []string) ([]chargeonce.WebhookDelivery, error) {
	if limit <= 0 || perMerchant <= 0 {
		return nil, nil
	}
	if skip == nil {
		skip = []string{}
	}
	token := idempotency.NewToken()
	rows, err := s.deliveryPool().Query(ctx, `
WITH due AS (
	SELECT id FROM (
		SELECT p.id, p.next_at, row_number() OVER (PARTITION BY e.merchant_id ORDER BY p.next_at, p.id) AS rn
		FROM webhook_endpoints e
		CROSS JOIN LATERAL (
			SELECT d.id, d.next_at FROM webhook_deliveries d
			WHERE d.endpoint_id = e.id AND d.state = 'pending' AND d.next_at <= now() AND d.claimed_until <= now()
			ORDER BY d.next_at, d.id LIMIT $3
		) p
		WHERE e.status = 'enabled' AND e.merchant_id <> ALL($5::text[])
	) y WHERE rn <= $3 ORDER BY next_at, id LIMIT $2
), d AS (
	-- By primary key, the ids in an array; the state is a parameter
	-- (statePending, params.go).
	UPDATE webhook_deliveries w SET claimed_until = now() + $1::interval, token = $4
	WHERE w.id = ANY (ARRAY(SELECT id FROM due)) AND w.state = $6 AND w.claimed_until <= now()
	RETURNING w.id, w.attempts, w.event_id, w.endpoint_id
)
SELECT d.id, d.attempts, ev.id, ev.merchant_id, ev.charge_id, coalesce(ev.object_id, ''), ev.type, ev.created_at,
	`+endpointColumnsE+`
FROM d JOIN webhook_events ev ON ev.id = d.event_id
JOIN webhook_endpoints e ON e.id = d.endpoint_id`, lease, limit, perMerchant, token, skip, statePending)
	if err != nil {
		return nil, fmt.Errorf("claiming webhook deliveries: %w", translate(err))
	}
	defer rows.Close()
	var out []chargeonce.WebhookDelivery
	for rows.Next() {
		d := chargeonce.WebhookDelivery{Token: token}
		var (
			status   string
			oldUntil *time.Time
		)
		e := &d.Endpoint
		if err := rows.Scan(&d.ID, &d.Attempts, &d.Event.ID, &d.Event.MerchantID, &d.Event.ChargeID, &d.Event.ObjectID, &d.Event.Type, &d.Event.CreatedAt,
			&e.ID, &e.MerchantID, &e.URL, &e.Description, &status, &e.DisabledReason,
			&e.Secret, &e.OldSecret, &oldUntil, &e.CreatedAt, &e.EnabledEvents, &e.MaxConcurrency); err != nil {
			return nil, fmt.Errorf("claiming webhook deliveries: %w", translate(err))
		}
		e.Status = chargeonce.EndpointStatus(status)
		if len(e.EnabledEvents) == 0 {
			e.EnabledEvents = nil
		}
		if oldUntil != nil {
			e.OldSecretUntil = *oldUntil
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claiming webhook deliveries: %w", translate(err))
	}
	rows.Close()
	if err := s.claimedCharges(ctx, out); err != nil {
		// The deliveries are claimed: the sender reads each charge itself.
		return out, nil //nolint:nilerr // a batch read that failed is made up for one by one
	}
	return out, nil
}

// claimedCharges reads the charges the claimed deliveries' events are
// about, in one statement, into their Charge: the sender renders each
// event's object without a statement per delivery. A refund's event is
// left to the sender (its object is the refund).
func (s *Store) claimedCharges(ctx context.Context, ds []chargeonce.WebhookDelivery) error {
	var ids []string
	for _, d := range ds {
		if d.Event.ObjectID == "" || !strings.HasPrefix(d.Event.Type, "refund.") {
			ids = append(ids, d.Event.ChargeID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	// By primary key; each charge's merchant is checked against its event's
	// below.
	rows, err := s.deliveryPool().Query(ctx, `SELECT `+chargeColumns+` FROM charges WHERE id = ANY ($1)`, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	byID := make(map[string]*chargeonce.Charge, len(ids))
	for rows.Next() {
		c, err := scanCharge(rows)
		if err != nil {
			return err
		}
		byID[c.ID] = &c
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range ds {
		d := &ds[i]
		if c := byID[d.Event.ChargeID]; c != nil && c.MerchantID == d.Event.MerchantID &&
			(d.Event.ObjectID == "" || !strings.HasPrefix(d.Event.Type, "refund.")) {
			d.Charge = c
		}
	}
	return nil
}

// endpointColumnsE is endpointColumns of the endpoint joined as e.
const endpointColumnsE = `e.id, e.merchant_id, e.url, e.description, e.status, COALESCE(e.disabled_reason, ''),
	e.secret, COALESCE(e.old_secret, ''), e.old_secret_until, e.created_at, e.enabled_events, COALESCE(e.max_concurrency, 0)`

// WebhookDeliveryFinish records the attempt, then settles the delivery
// under its claim, and keeps the endpoint's failure clock, in one
// transaction.
func (s *Store) WebhookDeliveryFinish(ctx context.Context, d chargeonce.WebhookDelivery, o chargeonce.WebhookOutcome) (bool, error) {
	a := o.Attempt
	var errText *string
	if a.Error != "" {
		errText = &a.Error
	}
	var code *int32
	if a.StatusCode != 0 {
		c := int32(a.StatusCode) //nolint:gosec // G115: an HTTP status
		code = &c
	}
	state, next := o.DeliveryState()
	var (
		claimed  bool
		disabled bool
	)
	// The endpoint's row is taken before the delivery's, the order a
	// disable takes them in (the endpoint, then its pending deliveries):
	// the other order deadlocked against a merchant's disable, which held
	// the endpoint and waited for this delivery (issue 48).
	err := pgx.BeginFunc(ctx, s.deliveryPool(), func(tx pgx.Tx) error {
		var (
			found       bool
			status      string
			failingLong bool
			reason      string
		)
		if o.Delivered {
			if _, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET failing_since = NULL
WHERE id = $1 AND failing_since IS NOT NULL`, d.Endpoint.ID); err != nil {
				return err
			}
		} else {
			err := tx.QueryRow(ctx, `SELECT status,
	failing_since IS NOT NULL AND now() - failing_since >= $2::bigint * interval '1 microsecond'
FROM webhook_endpoints WHERE id = $1 FOR NO KEY UPDATE`, d.Endpoint.ID, o.DisableAfter.Microseconds()).Scan(&status, &failingLong)
			switch {
			case err == nil:
				found = true
			case !errors.Is(err, pgx.ErrNoRows): // none: deleted meanwhile
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO webhook_attempts (event_id, endpoint_id, status_code, error, latency_us)
VALUES ($1, $2, $3, $4, $5)`, d.Event.ID, d.Endpoint.ID, code, errText, a.Latency.Microseconds()); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE webhook_deliveries
SET state = $3, attempts = attempts + 1, next_at = now() + $4::interval, claimed_until = '-infinity'
WHERE id = $1 AND token = $2 AND state = $5`, d.ID, d.Token, state, next, statePending)
		if err != nil {
			return err
		}
		claimed = tag.RowsAffected() == 1
		if o.Delivered || !found {
			return nil
		}
		disabled, reason = o.Disables(chargeonce.EndpointStatus(status), failingLong)
		if _, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET failing_since = COALESCE(failing_since, now()),
	status = CASE WHEN $2 THEN 'disabled' ELSE status END,
	disabled_reason = CASE WHEN $2 THEN $3 ELSE disabled_reason END
WHERE id = $1`, d.Endpoint.ID, disabled, reason); err != nil {
			return err
		}
		if disabled {
			_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET state = 'failed'
WHERE endpoint_id = $1 AND state = 'pending' AND id <> $2`, d.Endpoint.ID, d.ID)
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("finishing webhook delivery: %w", translate(err))
	}
	if !claimed {
		return disabled, chargeonce.Errorf(chargeonce.ESTALE, "webhook delivery %d is no longer held by this sender", d.ID)
	}
	return disabled, nil
}

// WebhookDeliveriesFinish records the delivered ones of fs in one
// statement (their attempts, their deliveries ended under their claims, the
// failure clock of their endpoints stopped), where one by one each took a
// transaction of four statements; the others, rarer and each with its
// endpoint's failure clock to keep, one by one.
func (s *Store) WebhookDeliveriesFinish(ctx context.Context, fs []chargeonce.WebhookFinish) {
	var (
		idx                       []int
		ids, latencies            []int64
		tokens, events, endpoints []string
		codes                     []int32
	)
	for i := range fs {
		f := &fs[i]
		if !f.Outcome.Delivered {
			f.Disabled, f.Err = s.WebhookDeliveryFinish(ctx, f.Delivery, f.Outcome)
			continue
		}
		idx = append(idx, i)
		ids, tokens = append(ids, f.Delivery.ID), append(tokens, f.Delivery.Token)
		events, endpoints = append(events, f.Delivery.Event.ID), append(endpoints, f.Delivery.Endpoint.ID)
		codes = append(codes, int32(f.Outcome.Attempt.StatusCode)) //nolint:gosec // G115: an HTTP status
		latencies = append(latencies, f.Outcome.Attempt.Latency.Microseconds())
	}
	if len(idx) == 0 {
		return
	}
	rows, err := s.deliveryPool().Query(ctx, `
WITH f AS (
	SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::integer[], $6::bigint[])
		WITH ORDINALITY AS f(id, token, event_id, endpoint_id, code, latency_us, n)
), a AS (
	INSERT INTO webhook_attempts (event_id, endpoint_id, status_code, latency_us)
	SELECT event_id, endpoint_id, code, latency_us FROM f ORDER BY n
), e AS (
	UPDATE webhook_endpoints SET failing_since = NULL
	WHERE id IN (SELECT endpoint_id FROM f) AND failing_since IS NOT NULL
	RETURNING 1
), d AS (
	-- The endpoints' rows before the deliveries' (WebhookDeliveryFinish):
	-- the count is a one-time filter, run before the first row is read.
	UPDATE webhook_deliveries w
	SET state = 'succeeded', attempts = w.attempts + 1, next_at = now(), claimed_until = '-infinity'
	WHERE w.id = ANY ($1) AND w.token = ($2::text[])[array_position($1, w.id)] AND w.state = $7
		AND (SELECT count(*) FROM e) >= 0
	RETURNING w.id
)
SELECT id FROM d`, ids, tokens, events, endpoints, codes, latencies, statePending)
	var ended []int64
	if err == nil {
		ended, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		err = fmt.Errorf("finishing webhook deliveries: %w", translate(err))
		for _, i := range idx {
			fs[i].Err = err
		}
		return
	}
	done := make(map[int64]bool, len(ended))
	for _, id := range ended {
		done[id] = true
	}
	for _, i := range idx {
		if id := fs[i].Delivery.ID; !done[id] {
			fs[i].Err = chargeonce.Errorf(chargeonce.ESTALE, "webhook delivery %d is no longer held by this sender", id)
		}
	}
}

// WebhookStats counts pending deliveries and disabled endpoints, with JIT
// compilation off: the planner's estimate of the counts (a queue table
// whose rows come and go faster than ANALYZE sees them) passes
// jit_above_cost, and compiling the statement took 1.2-3 s of CPU on a
// 2-core machine, for a count of a few rows (pg_stat_statements under
// bench --webhooks: jit_emission_time and jit_optimization_time were the
// whole of it). The bench's drain and the sender's metrics waited for it.
func (s *Store) WebhookStats(ctx context.Context) (chargeonce.WebhookStats, error) {
	var st chargeonce.WebhookStats
	err := pgx.BeginFunc(ctx, s.deliveryPool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
SELECT (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'),
	COALESCE((SELECT now() - min(created_at) FROM webhook_deliveries WHERE state = 'pending'), interval '0'),
	(SELECT count(*) FROM webhook_endpoints WHERE status = 'disabled')`).Scan(&st.Pending, &st.OldestPendingAge, &st.EndpointsDisabled)
	})
	if err != nil {
		return st, fmt.Errorf("counting webhook deliveries: %w", translate(err))
	}
	return st, nil
}
