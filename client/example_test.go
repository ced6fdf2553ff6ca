package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/chargeonce/chargeonce/client"
)

// One key per payment intent, stored before the first call, so that a
// crashed or timed-out process can ask again without charging twice. A
// captured charge pays the intent whether or not it is a replay (the first
// attempt's answer may have been lost): fulfil once per intent, keyed by
// the intent, never once per answer.
func ExampleClient_CreateCharge() {
	c := client.New("http://127.0.0.1:8080", "sk_test_demo")
	ctx := context.Background() // the client keeps trying for DefaultRetryFor (1 min)

	key := client.NewIdempotencyKey() // store it with the order first
	ch, err := c.CreateCharge(ctx, client.ChargeRequest{
		OrderID: 123, AmountCents: 25000, PaymentToken: "tok_ok", IdempotencyKey: key,
	})
	var declined *client.DeclinedError
	var gaveUp *client.GaveUpError
	switch {
	case errors.As(err, &declined):
		fmt.Println("declined:", declined.DeclineCode)
	case errors.As(err, &gaveUp):
		// Outcome unknown: maybe charged. Resume later with the same key.
		log.Printf("outcome unknown after %d attempts; call again later with key %s", client.Attempts(err), gaveUp.Key)
	case err != nil:
		log.Printf("not charged: %v", err) // a bug in the request or the API key
	default:
		// Paid, whether ch.Replayed or not: fulfil order 123 once, keyed
		// by the order, so that a second success for it changes nothing.
		fmt.Println("charged:", ch.ID)
	}
}
