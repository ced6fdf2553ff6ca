# The common tasks, with one obvious spelling each. `make help` lists them.
.PHONY: help build install run test test-suite test-full test-v lint bench bench-full fuzz chaos chaos-ha

# How long `make fuzz` runs each fuzz target: FUZZTIME=5m make fuzz.
FUZZTIME ?= 30s

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

# A release's version is `git describe` of its annotated tag (v0.4.0; after
# it, v0.4.0-3-gabc1234; -dirty with uncommitted changes); docs/operations.md.
VERSION ?= $(shell git describe --match 'v[0-9]*' --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
BIN ?= bin/chargeonce

build: ## bin/chargeonce, stamped with its version (git describe of the release tag) and commit
	go build -buildvcs=auto -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o $(BIN) ./cmd/chargeonce

# -buildvcs=auto: the go command stamps the commit, its time and a module
# version into the binary (chargeonce version), also where GOFLAGS turns it
# off (go env -w GOFLAGS=-buildvcs=false).
install: ## go install ./cmd/chargeonce: chargeonce on your PATH ($(go env GOPATH)/bin), saying which commit it is (chargeonce version)
	go install -buildvcs=auto ./cmd/chargeonce

run: ## run the service on the embedded SQLite default
	go run ./cmd/chargeonce serve

test: ## the quick tier (scripts/test-quick.sh): the docs, engine, idempotency, wire, SQLite store and simulator tests and the protocol table, with -race, no PostgreSQL; minutes, not half an hour
	./scripts/test-quick.sh

test-suite: ## the README's test command, CI's suite: installs PgBouncer and Chromium when missing, then go test -race ./... but the full tier
	./scripts/test.sh

test-full: ## the full tier CI runs besides: the HA chaos test (installs Patroni and etcd when missing; about 3 minutes) and the wall-clock fairness tests
	./scripts/test.sh --full

test-v: ## the tests, printing their measurements (latencies, counts)
	go test -race -v -run 'Race|InFlight|Soak|Crash|CheapAnswers|Overload|AdmissionWait|Outage|Storm|GracefulShutdown|Failover|InsertCommitted|LateSettlement|Forgetful|Redrive|NeverSendsAReference|StuckGauge|QueueBurst|ClusterNodeKilled|OpenAPIConformance|Flood|FairQueue|Fairness|ListChargesBounded|MigrateOnline|RollingUpgrade|ThroughPgBouncerUnderLoad|RecoveryAgainstStripeFake|OneTraceFromRequest|BatchSpanLinks|TraceFollowsAMessage|TracesExportedOverOTLP|StripeStorm|HonoursRetryAfter|SuiteFailsBrokenAdapters|ResolveRacesRecovery|CommonPathWritesNoHistoryRows|ConsoleInBrowser|WebhookStorm|DeadEndpointDoesNotDelayOthers|RetriesThenSucceeds|Chaos' ./... 2>&1 | grep -E '^(=== RUN|--- |\s+\S+_test.go|ok|FAIL)'

# The first `make lint` on a machine compiles golangci-lint (pinned in go.mod)
# before it checks anything: minutes with no output of its own, so it says so
# first.
lint: ## golangci-lint (the version pinned in go.mod; checks in .golangci.yml)
	@echo "make lint: golangci-lint runs once go has compiled it (the version in go.mod): a few minutes with no output the first time on a machine, cached after"
	go tool golangci-lint run ./...

bench: ## micro-benchmarks of the hot functions, with allocations
	go test -run '^$$' -bench . -benchmem ./idempotency/ ./engine/ ./httpapi/ ./replaycache/ ./tracing/

bench-full: ## chargeonce bench: chargeonce against a bare handler and raw SQL (about 2 minutes)
	go run ./cmd/chargeonce bench

fuzz: ## every native fuzz target (func FuzzXxx), each for FUZZTIME (default 30s)
	@found=0; \
	for f in $$(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' . | sort); do \
	  for t in $$(grep -oE '^func Fuzz[A-Za-z0-9_]*' "$$f" | cut -d' ' -f2); do \
	    found=1; d=$$(dirname "$$f"); \
	    echo "go test -run '^\$$' -fuzz '^$$t\$$' -fuzztime $(FUZZTIME) $$d/"; \
	    go test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) "$$d/" || exit 1; \
	  done; \
	done; \
	if [ $$found = 0 ]; then echo "no fuzz targets yet (func FuzzXxx(f *testing.F) in a _test.go file)"; fi

# How long `make chaos` runs, and the seed it replays (empty: a random one,
# printed): CHAOS_TIME=30m make chaos, CHAOS_SEED=123456 make chaos.
CHAOS_TIME ?= 5m
CHAOS_SEED ?=
CHAOS_OUT ?= chaos-out

chaos: ## the nemesis suite for CHAOS_TIME (default 5m), seed printed; history in CHAOS_OUT (docs/testing.md)
	CHAOS_TIME=$(CHAOS_TIME) CHAOS_SEED=$(CHAOS_SEED) CHAOS_OUT=$(abspath $(CHAOS_OUT)) \
	  go test -count=1 -timeout 0 -v -run '^TestChaos$$' ./chaos/

# How long `make chaos-ha` runs (the seed is CHAOS_SEED, printed).
CHAOS_HA_TIME ?= 10m

chaos-ha: ## the HA nemesis on Patroni and etcd for CHAOS_HA_TIME (default 10m); failover times logged (docs/ha.md)
	CHAOS_HA_TIME=$(CHAOS_HA_TIME) CHAOS_SEED=$(CHAOS_SEED) CHAOS_OUT=$(abspath $(CHAOS_OUT)) \
	  go test -count=1 -timeout 0 -v -run '^TestChaosHA$$' ./chaos/
