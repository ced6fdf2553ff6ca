package httpserve_test

import (
	"testing"

	"github.com/chargeonce/chargeonce/internal/httpserve"
)

func TestLoopbackHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"localhost": true, "LOCALHOST:8080": true, "127.0.0.1": true, "127.0.0.1:8080": true, "127.1.2.3:1": true,
		"[::1]": true, "[::1]:8081": true, "::1": true, "[::ffff:127.0.0.1]:80": true,
		"": false, "rebind.attacker.example": false, "rebind.attacker.example:8080": false, "localhost.attacker.example": false,
		"127.0.0.1.nip.io": false, "localhost.": false, "10.0.0.1:8080": false, "[2001:db8::1]:80": false, "[::1%lo]:80": false,
		"0.0.0.0:8080": false,
	} {
		if got := httpserve.LoopbackHost(host); got != want {
			t.Errorf("LoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
