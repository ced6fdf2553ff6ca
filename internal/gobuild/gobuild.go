// Package gobuild builds binaries for the tests that run real processes
// (e2e, chaos), one `go build` at a time across the module's test binaries.
package gobuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// lockName is the file, in the temporary directory, whose lock every build
// takes.
const lockName = "chargeonce-go-build.lock"

// Build runs `go build -o out args...` in dir ("" for the current
// directory) and returns its output. go test runs packages in parallel, and
// two builds of the same packages at once each compile all of them: the
// build cache holds finished work, not work in progress. On a fresh machine
// that doubled the compile of the binary's dependencies. So Build holds a
// lock shared by every test process while it builds; the build that waited
// finds the packages in the cache and only links.
//
// "go" is the toolchain running the tests: go test puts its GOROOT/bin
// first in the test binary's PATH.
func Build(dir, out string, args ...string) ([]byte, error) {
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the build lock: %w", err)
	}
	defer lock.Close() // closing releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("taking the build lock: %w", err)
	}
	cmd := exec.CommandContext(context.Background(), "go", append([]string{"build", "-o", out}, args...)...) //nolint:gosec // G204: the tests' own build arguments
	cmd.Dir = dir
	return cmd.CombinedOutput()
}
