#!/usr/bin/env bash
# The README's test command: every test, with the race detector, on a fresh
# machine that has Go and PostgreSQL's server binaries.
#
# The tests run real components and fail (never skip) without them, so this
# first installs the Debian packages a fresh machine lacks:
#   pgbouncer  the pooler tests (docs/pooler.md)
#   chromium   the console's browser test (docs/operators.md)
#   patroni    the high-availability tests (docs/ha.md), with
#   etcd-server  their distributed configuration store
# apt-get runs through sudo unless this runs as root. Extra arguments go to
# go test (./scripts/test.sh -count=1 -v).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
command -v chromium >/dev/null || [ -x /usr/bin/chromium ] || need+=(chromium)
command -v patroni >/dev/null || [ -x /usr/bin/patroni ] || need+=(patroni)
command -v etcd >/dev/null || [ -x /usr/bin/etcd ] || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
	echo "test.sh: installing what the tests need: ${need[*]}" >&2
	if ! command -v apt-get >/dev/null; then
		echo "test.sh: no apt-get here: install ${need[*]} yourself, then run this again" >&2
		exit 1
	fi
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -q
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

# The rolling-upgrade test builds the last release (docs/releases) from git
# history: a shallow clone fetches it.
if [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
	git fetch --quiet --unshallow || echo "test.sh: warning: could not unshallow; TestRollingUpgrade needs the release commit" >&2
fi

# A package binary may run 30 minutes (the default is 10): the chaos suite,
# with its HA cluster, runs several minutes on a 2-core machine under the
# whole suite's load. A later -timeout in the arguments wins.
exec go test -race -timeout=30m "$@" ./...
