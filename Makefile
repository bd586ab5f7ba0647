# hyperplan: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all venv lock system-deps tools plane plane-down crds crds-check demo test test-unit test-integration test-e2e test-kind binaries kind kind-images kind-down bench clean

all: venv

# The runtime dependencies are installed at the versions of requirements.lock (what the image ships),
# through a copy without its hashes: hashes in a constraints file put pip in hash-checking mode for
# the whole install, which the editable project (and the test tools, not in the lock) cannot pass.
CONSTRAINTS := $(VENV)/constraints.txt

$(CONSTRAINTS): requirements.lock
	@mkdir -p $(dir $@)
	sed -e '/^[[:space:]]*--hash=/d' -e 's/[[:space:]]*\\$$//' requirements.lock > $@

$(STAMP): pyproject.toml requirements.lock $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,demo]' -c $(CONSTRAINTS)
	@touch $(STAMP)

venv: $(STAMP)

# Re-pin requirements.lock to the venv after changing pyproject's dependencies
# (`pip install -e .` without the lock first if a new version is wanted); asks the package index
# for the sha256 of each pinned version's wheels.
lock:
	$(BIN)/python -m hyperplan_dev.lock requirements.lock

# System packages the tests use: Prometheus (promtool) and a Docker engine (the kind tier).
# As root, installs what is missing with apt and starts dockerd; otherwise says what to install.
system-deps: venv
	$(BIN)/python -m hyperplan_dev.hostsetup

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
	$(BIN)/python -m hyperplan_dev.demo

# The whole suite: unit, integration (real API server), e2e (operator as its own process),
# federation (three named planes side by side, an operator on each) and the kind tier (the
# operator's image and chart on a real kind cluster). The planes and the kind cluster of a run
# are started by the test session and stopped again at its end.
test: venv system-deps binaries kind-images
	$(BIN)/python -m pytest -ra tests/unit tests/integration tests/e2e tests/federation tests/kind

# The control-plane binaries, built from their Go modules once per machine (~/.cache/hyperplan).
binaries: venv
	$(BIN)/python -m hyperplan_dev.build

# Prometheus and promtool come from Debian's package (`make system-deps` installs it as root).
tools:
	@command -v promtool >/dev/null || { echo "promtool missing: apt-get install prometheus (or run make system-deps as root)"; exit 1; }

# A kind cluster named hyperplan (1 control plane + 2 workers) with the operator installed by
# Helm under the demo profile; kubeconfig in .state/kind/kubeconfig. See docs/install-on-kind.md.
kind: venv
	$(BIN)/hyperplan dev kind up

kind-down: venv
	$(BIN)/hyperplan dev kind down

# kind, the node image and the base images, built where they cannot be pulled (cached).
kind-images: venv
	$(BIN)/hyperplan dev kind build

test-kind: venv system-deps binaries kind-images
	$(BIN)/python -m pytest -ra tests/kind

test-unit: venv
	$(BIN)/python -m pytest -ra tests/unit

test-integration: venv
	$(BIN)/python -m pytest -ra tests/integration

test-e2e: venv
	$(BIN)/python -m pytest -ra tests/e2e

# The targets, each measured on their own control plane (.state/bench); figures in docs/benchmarks.md.
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

# Faults survived: kill -9 of the leader 30+ times, two API server restarts and an etcd
# restart under a mixed workload, on its own control plane (.state/bench); invariants after every
# fault, figures in docs/reliability.md. About 5-6 minutes; exits 1 on a violation or a missed bound.
.PHONY: chaos
chaos: venv
	BENCH_STRICT=1 $(BIN)/python bench/chaos.py

# Scale, each on its own control plane (.state/bench); figures in docs/benchmarks.md:
# the cost of one pass at 72 to 1,152 nodes, API reads per reconcile, 1,000 purchases against
# their floor, memory, idle writes and CPU at the issue's full size (10,000 plans and 5,408 KWOK
# nodes reporting at a kubelet's rate), the 288-node provisioning and the failure storm. The full
# size takes about 25 minutes on 2 cores (`bench/scale.py --plans 1000 --groups 4` for a quick look).
.PHONY: bench-scale
bench-scale: venv
	$(BIN)/python bench/pass_cost.py
	$(BIN)/python bench/reads.py
	$(BIN)/python bench/purchases.py
	$(BIN)/python bench/scale.py --groups 80
	$(BIN)/python bench/provisioning.py
	$(BIN)/python bench/storm.py

# The reference pages generated from the code (docs/reference/: settings, metrics, CRD fields);
# a unit test (tests/unit/test_docs.py) fails when they drift.
.PHONY: docs docs-check
docs: venv
	$(BIN)/python -m hyperplan_dev.docgen

docs-check: venv
	$(BIN)/python -m hyperplan_dev.docgen --check
