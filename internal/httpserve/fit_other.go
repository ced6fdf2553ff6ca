//go:build !unix

package httpserve

// FitDescriptors returns maxConns: only Unix systems have a descriptor limit
// to fit.
func FitDescriptors(maxConns int) int { return maxConns }
