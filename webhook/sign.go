// Package webhook delivers settlement events to merchants' endpoints, signed
// as Standard Webhooks 1.0 prescribes, and helps receivers check them.
//
// The sender (Sender) is fed by the store's outbox of deliveries: every
// instance runs one, each claims due deliveries with a lease, so two
// instances never send the same attempt at once, and a crash mid-delivery
// only means it is sent again. The receiver side (Verify, Handler) is what
// a merchant's Go service uses to accept them.
package webhook

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The Standard Webhooks headers.
const (
	HeaderID        = standardwebhooks.HeaderWebhookID
	HeaderTimestamp = standardwebhooks.HeaderWebhookTimestamp
	HeaderSignature = standardwebhooks.HeaderWebhookSignature
)

// secretBytes is the length of a new secret's key: 24 bytes, as Svix and
// the Standard Webhooks examples use.
const secretBytes = 24

// NewSecret returns a fresh signing secret, whsec_ and base64 of random
// bytes, as Standard Webhooks writes them.
func NewSecret() string {
	b := make([]byte, secretBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// Sign returns the webhook-signature header of a message: one
// "v1,<base64>" per secret, space-separated (two while a rotation's old
// secret still signs).
func Sign(secrets []string, id string, at time.Time, body []byte) (string, error) {
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			return "", fmt.Errorf("webhook secret: %w", err)
		}
		sig, err := wh.Sign(id, at, body)
		if err != nil {
			return "", fmt.Errorf("signing webhook: %w", err)
		}
		sigs = append(sigs, sig)
	}
	return strings.Join(sigs, " "), nil
}
