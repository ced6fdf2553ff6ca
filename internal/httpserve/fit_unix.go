//go:build unix

package httpserve

import (
	"math"
	"syscall"
)

// FitDescriptors returns maxConns, or less when the process's file
// descriptor limit (RLIMIT_NOFILE) leaves fewer than maxConns descriptors
// after a reserve for the database, NATS and files: past that limit accept
// fails, and nobody, /healthz included, is served.
func FitDescriptors(maxConns int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > math.MaxInt32 {
		return maxConns
	}
	avail := int(lim.Cur) - fdReserve //nolint:gosec // checked above: fits an int
	if avail >= maxConns {
		return maxConns
	}
	return max(avail, minMaxConns)
}
