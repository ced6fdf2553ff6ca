// Package chargeonce holds the domain of the chargeonce service: charges, the
// idempotency records that guard them, the error codes every layer speaks, and
// the interfaces of the two outside things the service depends on (a Store and
// an Acquirer).
//
// The package imports nothing of the application: the stores (postgres/,
// sqlite/), the HTTP layer (httpapi/) and the acquirer (acquirer/) depend on it,
// never the other way round.
package chargeonce
