// Package acquirer is chargeonce's side of the party that moves money: a
// simulator of an acquirer that is idempotent by reference, the stand-alone
// HTTP API that serves it (`chargeonce acquirer`), and a Client that speaks
// that API. Both Simulator (in-process, `serve --acquirer sim`) and Client
// (over HTTP) implement chargeonce.Acquirer.
//
// # Test tokens
//
// Like a card network's test cards, the payment token decides what happens:
//
//	tok_ok (and any token not listed)  captured
//	tok_declined                       declined, decline_code insufficient_funds
//	tok_slow                           captured after Options.Slow
//	tok_fail_before                    503, nothing captured
//	tok_fail_after                     captured, then 503 (the reply is lost)
//
// Both faults strike only the first request for a reference; every later
// request for that reference behaves as tok_ok would, like a transient outage.
//
// # Idempotency by reference
//
// The first request for a reference starts the capture. A request for a
// reference whose capture is under way waits for it and gets its result; a
// request for a reference that has settled (captured or declined) gets the
// stored result. Neither moves money: both count as duplicate requests.
//
// Like a real acquirer, the simulator can forget: with an idempotency window
// (Options.IdempotencyWindow, `--idempotency-window`) a request for a
// reference more than the window after the first request of its window is
// a new request and captures again. Lookup (GET /v1/captures/{reference})
// still finds the first capture, which is why chargeonce looks a reference
// up before re-driving it.
//
// The result of a repeated reference is the first result even when the
// repeated request carries a different body (amount, token): the acquirer
// deduplicates on the reference alone, as real acquirers do with their
// idempotency keys. chargeonce never does this (its reference is the charge
// ID, and a charge's fields never change), so the simulator does not police it.
//
// # Callers that give up
//
// The capture runs on its own goroutine, independent of the caller's context.
// A caller whose context ends (a timeout, a client that hung up) stops waiting
// and gets ctx.Err(), but the capture still completes, as a real acquirer
// would finish a capture whose reply nobody reads. This is the case that makes
// chargeonce's recovery necessary: the service saw an unknown outcome while
// the money moved, and re-driving the capture with the same reference must
// return that capture instead of making a second one.
//
// # The ledger
//
// Every capture that settles (captured or declined), including a second one
// under a reference after its idempotency window, is an entry in the
// simulator's ledger, with its own id and a kind (capture; refund and void
// once the simulator moves money back). Simulator.LedgerList and
// Client.LedgerList (GET /v1/ledger) page through the entries created in a
// time range, ordered by the reference of the charge they belong to, for
// reconciliation (package recon): both implement chargeonce.Ledger.
package acquirer
