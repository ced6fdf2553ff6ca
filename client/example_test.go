package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/chargeonce/chargeonce/client"
)

// One key per payment intent, stored before the first call, so that a
// crashed or timed-out process can ask again without charging twice.
func ExampleClient_CreateCharge() {
	c := client.New("http://127.0.0.1:8080", "sk_test_demo")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	key := client.NewIdempotencyKey() // store it with the order first
	ch, err := c.CreateCharge(ctx, client.ChargeRequest{
		OrderID: 123, AmountCents: 25000, PaymentToken: "tok_ok", IdempotencyKey: key,
	})
	var declined *client.DeclinedError
	switch {
	case errors.As(err, &declined):
		fmt.Println("declined:", declined.DeclineCode)
	case err != nil:
		log.Printf("outcome unknown after %d attempts; retry later with key %s: %v", client.Attempts(err), key, err)
	case ch.Replayed:
		fmt.Println("already charged by an earlier attempt:", ch.ID) // do not fulfil twice
	default:
		fmt.Println("charged:", ch.ID)
	}
}
