# hyperplan: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all venv tools plane plane-down crds crds-check demo test test-unit test-integration test-e2e bench clean

all: venv

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# Builds the control-plane binaries on first use (cached in ~/.cache/hyperplan), then starts them.
plane: venv
	$(BIN)/hyperplan dev up

plane-down: venv
	$(BIN)/hyperplan dev down

crds: venv
	$(BIN)/hyperplan crds --out crds
	cp crds/*.yaml charts/hyperplan/crds/

crds-check: venv
	$(BIN)/hyperplan crds --check --out crds

# The main job: the local control plane, the CRDs, example objects, and the operator in the
# foreground under the `demo` policy profile. Ctrl-C stops the operator; `make plane-down` the plane.
demo: venv
	$(BIN)/python -m hyperplan.demo

# The whole suite: unit, integration (real API server) and e2e (operator as its own process).
# One control plane per run, started by the test session and stopped again at its end.
test: venv tools
	$(BIN)/python -m pytest -ra tests/unit tests/integration tests/e2e

# Prometheus and promtool come from Debian's package (.ci/run installs it on a fresh machine).
tools:
	@command -v promtool >/dev/null || { echo "promtool missing: apt-get install prometheus (or run .ci/run)"; exit 1; }

test-unit: venv
	$(BIN)/python -m pytest -ra tests/unit

test-integration: venv
	$(BIN)/python -m pytest -ra tests/integration

test-e2e: venv
	$(BIN)/python -m pytest -ra tests/e2e

# Targets of DESIGN.md section 6, measured on their own control plane (.state/bench); figures in docs/benchmarks.md.
bench: venv
	$(BIN)/python bench/transitions.py
	$(BIN)/python bench/nodes_ready.py
	$(BIN)/python bench/spare_promotion.py
	$(BIN)/python bench/idle.py
	$(BIN)/python bench/failover.py

clean:
	rm -rf $(VENV) .state .pytest_cache

# Alert rules (deploy/prometheus/alerts.yml, the chart's PrometheusRule) and Grafana dashboards
# (deploy/grafana/, the chart's copy) from src/hyperplan/monitoring/; tests fail when they drift.
.PHONY: dashboards dashboards-check
dashboards: venv
	$(BIN)/python -m hyperplan.monitoring

dashboards-check: venv
	$(BIN)/python -m hyperplan.monitoring --check

# Faults survived (issue 9): kill -9 of the leader 30+ times, two API server restarts and an etcd
# restart under a mixed workload, on its own control plane (.state/bench); invariants after every
# fault, figures in docs/reliability.md. About 5-6 minutes; exits 1 on a violation or a missed bound.
.PHONY: chaos
chaos: venv
	BENCH_STRICT=1 $(BIN)/python bench/chaos.py
