package chargeonce

// ProblemTypeBase prefixes every problem type URI; the type ends in the
// error code's slug (for example ProblemTypeBase + "card-declined"), so
// clients can switch on the slug.
const ProblemTypeBase = "https://chargeonce.dev/problems/"

// Problem is an RFC 9457 problem details object. ChargeID and DeclineCode
// are extension members used by card-declined problems; RequestID names the
// HTTP request that was answered (never in a stored answer, which is
// replayed byte for byte to later requests).
type Problem struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Status      int    `json:"status"`
	Detail      string `json:"detail"`
	Field       string `json:"field,omitempty"`
	ChargeID    string `json:"charge_id,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
	RequestID   string `json:"request_id,omitempty"`
}
