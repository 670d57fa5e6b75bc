# rcpflow: `make test` and `make demo` each set up .venv from a fresh clone first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

# Local runs are CPU-only; name the platform so JAX does not probe for accelerators.
export JAX_PLATFORMS ?= cpu

.PHONY: setup system-packages test test-fast check demo ui bench bench-verdict lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[all]'
	touch $(STAMP)

# What CI runs (.ci/run): lint, formatting, types, then the whole suite on TEST_WORKERS pytest-xdist
# workers side by side (tests/conftest.py keeps a module, and the modules sharing a session
# server, on one worker). Three on 2 cores: an Airflow test leaves a core idle part of the
# time, waiting on its scheduler and jobs (CONTRIBUTING.md). TEST_WORKERS=0 runs it in this
# process.
# The checks and the system's setup run side by side (mypy is CPU, the Debian roots mostly
# network and disk); measured on a fresh clone here: the venv 170 s, then both 137 s.
TEST_WORKERS ?= 3
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target check system-packages
	$(PY) -m pytest -n $(TEST_WORKERS) --durations=40 --tb=short

# Debian packages the tests need (PostgreSQL for the Airflow metadata DB, Redis for the Celery
# broker of the distributed Airflow, Chromium and its driver
# for the UI test; a private Slurm and an sshd standing in for its login node, for the Slurm
# backend's tests: docs/slurm.md; debootstrap for the Debian 13 root holding Slurm 24.11,
# docs/slurm-versions.md), installed when missing; CI runs as root. Slurm's packages
# without their recommends (which pull ~30 more: hdf5, rocm, ...). docker.io, containerd and
# runc build and run the images of docker/ and the real pods (docs/containers.md).
SYSTEM_PACKAGES := postgresql chromium chromium-driver openssh-server debootstrap redis-server docker.io containerd runc
SLURM_PACKAGES := slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin
system-packages: setup
	@missing() { for p in "$$@"; do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; \
	done; }; \
	plain=$$(missing $(SYSTEM_PACKAGES)); slurm=$$(missing $(SLURM_PACKAGES)); \
	if [ -n "$$plain$$slurm" ]; then \
		echo "installing Debian packages: $$plain $$slurm"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -q || exit 1; \
		if [ -n "$$plain" ]; then DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$plain || exit 1; fi; \
		if [ -n "$$slurm" ]; then DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$slurm || exit 1; fi; \
	fi
	@# Slurm 24.11 in a Debian 13 root under .cache/ (built once, ~1 min; needs root to chroot).
	@if [ "$$(id -u)" = 0 ]; then $(PY) -m devtools.servers.slurm_root; fi
	@# MaxText's job environment: a Python 3.13 venv in a Debian 13 root under .cache/ (built once,
	@# ~2 min; needs root; docs/maxtext.md), and its Python wrapper .cache/maxtext-env/python.
	@if [ "$$(id -u)" = 0 ]; then $(PY) -m devtools.servers.maxtext_env; fi

# Lint, formatting and types: the same checks as .pre-commit-config.yaml.
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The suite without the slow end-to-end tests (CI runs everything).
test-fast: setup
	$(PY) -m pytest -m "not slow"

demo: setup $(if $(filter slurm,$(BACKEND))$(filter celery,$(EXECUTOR))$(filter maxtext,$(TRAINER)),system-packages)  # EXECUTOR=celery: a distributed Airflow (Celery workers; with BACKEND=slurm); BACKEND=slurm: the toy jobs on a private Slurm (docs/slurm.md); TRAINER=tunix: Tunix's GRPO trainer and evaluator (docker/deployment.tunix.toml); TRAINER=rehearsal: the rehearsal jobs (docker/deployment.rehearsal.toml); TRAINER=maxtext: MaxText's jobs in their own environment (docker/deployment.maxtext.toml, docs/maxtext.md)
	$(PY) -m devtools.demo --trainer $(or $(TRAINER),toy) --backend $(or $(BACKEND),local) --executor $(or $(EXECUTOR),local)

ui: setup  # the finished demo's Airflow on 127.0.0.1 again (address and login printed), until Ctrl-C
	$(PY) -m devtools.demo --ui-only --trainer $(or $(TRAINER),toy)

bench: setup system-packages  # writes BENCHMARKS.md: recording overhead (toy, Tunix, MaxText; MaxText's conversion vs views), time to verdict, the Slurm schedules, storage with and without retention
	$(PY) -m devtools.bench.checkpoint_bench
	$(PY) -m devtools.bench.tunix_bench
	$(PY) -m devtools.bench.maxtext_bench
	$(PY) -m devtools.bench.verdict_bench
	$(PY) -m devtools.bench.slurm_bench
	$(PY) -m devtools.bench.storage_bench
	$(PY) -m devtools.bench.storage_bench --rehearsal

bench-verdict: setup
	$(PY) -m devtools.bench.verdict_bench

lint: check

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache

# The real Kubernetes control plane of tests/tasks/backends/gke/real/ (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, JobSet, kwok, Kueue), built from the Go modules in
# tests/k8s/controlplane/ into .cache/k8s-bin/<pins hash>/; docs/k8s-control-plane.md.
.PHONY: k8s-bin
k8s-bin:
	nice -n 10 tests/k8s/controlplane/build.sh
