package acquirer

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if any test leaves a goroutine behind: a capture
// still running, a handler, or an idle HTTP connection.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// underway reports whether reference has a capture running; tests use it to
// line up a second request behind the first.
func (s *Simulator) underway(reference string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref := s.refs[reference]
	return ref != nil && ref.run != nil
}
