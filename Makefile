SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -euc
MAKEFLAGS += --warn-undefined-variables
export PATH := $(PATH):/usr/local/go/bin

GO ?= go
# Where make run keeps its state (deploy/local/run.sh reads the same variable):
# the targets below that talk to that cluster find its config there.
REDCELL_VAR ?= var
BIN := $(REDCELL_VAR)/bin/redcell
# Packages whose tests exercise concurrency on the money paths run with -race.
RACE_PKGS := ./api/... ./cell/... ./storage/... ./sharding/... ./router/... ./internal/...
# The packages of RACE_PKGS run in the race pass, not again in the unit pass,
# but for UNIT_ONLY: long tests that run one goroutine's path (a standby
# refused, 70 days of archiving with a fake clock, bounded outage logs) and
# the tests the race detector skips or shortens (allocation counts, the
# 10,000-op reward money runs, a 6 s wait for a rate).
UNIT_ONLY := ^(TestFailoverRefusesAnUnknownStandby|TestArchiveSeventyDays|TestOutageLogsBounded|TestStampAllocatesNothing|TestSignerAllocs|TestRewardMoney|TestRewardMoneyMySQL|TestBookerWaitsForItsRateOutsideTheTransaction)$$
RACE_SKIP := ^(TestFailoverRefusesAnUnknownStandby|TestArchiveSeventyDays|TestOutageLogsBounded)$$

.PHONY: help run cluster-netns test unit race drill sim build audit bench-smoke vet fmt tidy clean

## run: install what is missing, start router + 2 cells + MariaDB x2 + memcached, serve on :8080
run:
	deploy/local/run.sh

## help: this list of targets
help:
	@awk '/^## /{sub(/^## /, ""); print}' $(firstword $(MAKEFILE_LIST))

## cluster-netns: (root) make run's cluster as if on three hosts: router + memcached, and each cell with its
## MariaDB, in network namespaces of their own on a bridge (10.213.N.0/24); state in var/netns; everything
## it made (processes, namespaces, veths, bridge) is removed when it stops (docs/operations.md, "A multi-host
## rehearsal on one machine")
cluster-netns:
	deploy/netns/cluster.sh

## test: unit, integration (real MariaDB + memcached) and end-to-end tests, and the race
## pass, side by side, each on servers of its own (rows one pass leaves, moved, archived or
## dropped by design in some tests, never meet the other's audits); lines are marked
## [unit] or [race]
test:
	deploy/local/testenv.sh --install
	@mkdir -p $(TEST_LOGS)
	$(MAKE) --no-print-directory -j2 test-unit test-race || \
		{ deploy/local/testfailures.sh $(TEST_LOGS)/unit.log $(TEST_LOGS)/race.log; exit 1; }

# Each pass's output is also kept in $(TEST_LOGS); when make test fails, its last
# lines are each failed test's name and message, and any panic, from both passes
# (deploy/local/testfailures.sh), so a log's tail says what failed.
TEST_LOGS := $(REDCELL_VAR)/test
# The two passes of make test. Most of the unit pass's time is the drills and
# clusters of cmd/redcell waiting on timeouts and restarts, most of the race
# pass's is CPU: side by side they take about the longer one's time.
.PHONY: test-unit test-race
test-unit:
	deploy/local/testenv.sh $(MAKE) --no-print-directory unit 2>&1 | sed -u 's/^/[unit] /' | tee $(TEST_LOGS)/unit.log
test-race:
	deploy/local/testenv.sh $(MAKE) --no-print-directory race 2>&1 | sed -u 's/^/[race] /' | tee $(TEST_LOGS)/race.log

## drill: the fault drills at full length (kill -9 a cell and start it on the same or new ports, restart a MariaDB, stop memcached,
## a cell leaving and rejoining, kill -9 the router, rewards issued while a cell is killed and while the booking is off,
## overload, growing and failing back a cluster with standbys; as root also the netns drills: a cell partitioned past memberlist's dead-node timeout, and latency and
## loss by Toxiproxy between the router and a cell and between that cell and its MariaDB), each ending with a clean audit;
## make test runs a short version of the same drills
drill:
	. deploy/local/services.sh && ensure_packages && \
		REDCELL_DRILL=full $(GO) test -count=1 -v -timeout 45m -run '^(TestDrill|TestDrillNetns)$$' ./cmd/redcell/

## sim: the deterministic simulation of a router and 3 cells (package sim) for SIM_SEEDS seeds of
## SIM_STEPS operations each, fresh random seeds unless SIM_SEED is set (then SIM_SEED, SIM_SEED+1, ...);
## prints each seed, its operations and its event-log hash; a failure prints the command that replays it.
## Each seed runs twice: the cells committing one store call per request, then as strategy grouped
## (--grouped: ops of one database committed together). make test runs a short version
## (TestSimSeeds, TestSimGroupedSeeds, TestSimCatchesPlantedCreditTwice in ./sim).
SIM_SEED ?= 0
SIM_SEEDS ?= 3
SIM_STEPS ?= 100000
sim: build
	$(BIN) sim --seed $(SIM_SEED) --seeds $(SIM_SEEDS) --steps $(SIM_STEPS)
	$(BIN) sim --grouped --seed $(SIM_SEED) --seeds $(SIM_SEEDS) --steps $(SIM_STEPS)

# Each pass ends with the closing audit of the test servers (internal/testaudit):
# every namespace of databases on both, real and shadow, audited across the two.
TEST_AUDIT := $(GO) run ./internal/testaudit/cmd/testaudit

unit: vet-go
	$(GO) test -p 1 -count=1 -timeout 30m $$(comm -23 <($(GO) list ./... | sort) <($(GO) list $(RACE_PKGS) | sort))
	$(GO) test -p 1 -count=1 -timeout 30m -run '$(UNIT_ONLY)' $(RACE_PKGS)
	$(TEST_AUDIT) "make unit"

race: staticcheck
	$(GO) test -race -p 1 -count=1 -timeout 30m -skip '$(RACE_SKIP)' $(RACE_PKGS)
	$(TEST_AUDIT) "make race"

build:
	$(GO) build -o $(BIN) ./cmd/redcell

# vet: go vet and gofmt (vet-go), and staticcheck (pinned in go.mod as a
# tool; its default checks). make test runs vet-go at the start of the unit
# pass and staticcheck at the start of the race pass, whose tests end sooner
# than the unit pass's drills. The layering rules are a test of their own
# (internal/layering).
.PHONY: vet-go staticcheck
vet: vet-go staticcheck
staticcheck:
	$(GO) tool staticcheck ./...
vet-go:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }

## audit: conservation check of the cluster started by make run
audit: build
	$(BIN) audit --config $(REDCELL_VAR)/redcell.yaml

## bench-smoke: a short load through the router of the cluster started by make run
bench-smoke: build
	$(BIN) bench --config $(REDCELL_VAR)/redcell.yaml --senders 4 --openers 32 --duration 10s

## bench: against the cluster started by make run, in about ten minutes (deploy/local/bench.sh): roundrobin,
## cold and hot, one run per strategy (naive, batched, grouped when built), hot with the ceilings
## (database, HTTP via router and direct); festival: each strategy's highest sustained open-loop
## rate (p99 within 50 ms, nothing shed) by a short search, then a run at 70% of the last one's,
## audited; rewards: token issuance against book_now (issues/s, booking lag) and the lag at a fixed rate, about 30 s.
## Reports in var/bench/<time>/{roundrobin,cold,hot,festival,rewards,rewards-lag}/; BENCH_STRATEGIES picks the strategies.
BENCH_SUITE := deploy/local/bench.sh
REDCELL_PPROF ?=
BENCH_PPROF ?= $(if $(filter 1,$(REDCELL_PPROF)),127.0.0.1:6060,)
.PHONY: bench
bench: build
	REDCELL_VAR=$(REDCELL_VAR) BIN=$(BIN) BENCH_PPROF=$(BENCH_PPROF) $(BENCH_SUITE)

fmt:
	gofmt -w $$(git ls-files '*.go')

tidy:
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

clean:
	rm -rf var
