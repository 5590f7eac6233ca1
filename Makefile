# eagle3ops — the two commands that matter: `make run` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.eagle3ops-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# Bytecode is written (git-ignored __pycache__/): with PYTHONDONTWRITEBYTECODE every xdist worker re-did pytest's
# assertion rewrite of every test module (~6 s CPU per collection) and every eagle3ops process recompiled the package.
# unexport: these machines set PYTHONDONTWRITEBYTECODE=1 in every shell's environment (CI's too), so leaving the
# variable out of this Makefile was not enough (no __pycache__ after a whole `make test`, 2026-12-03).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help venv run test test-slow test-durations test-vm lint unit options system-deps clean lock

help:
	@echo "make run   - create the venv and run site.yml on the embedded local default (inventory/local)"
	@echo "make test  - ruff, ansible-lint (production), pytest: every test not marked slow or nspawn (<= 15 min)"
	@echo "make test-slow - the slow integration tests and those that boot hosts (marks slow, nspawn; CI's step 2)"
	@echo "make test-durations - what each test costs: pytest --durations (GROUP=tests/ansible for one group)"
	@echo "make test-vm - the QEMU VM storage test alone (~20 min under TCG: docs/conventions.md)"
	@echo "make lint  - ruff + ansible-lint only"
	@echo "make options - rewrite every generated option list from the definitions (python/eagle3ops/<phase>/options.py)"

$(STAMP): requirements/workload.txt requirements/control.txt requirements/speculators.txt requirements/constraints.txt collections/requirements.yml collections/install.py pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY) (Python 3.11: the CPU torch wheel is pinned for it)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -c requirements/constraints.txt -r requirements/workload.txt -r requirements/control.txt
	$(BIN)/pip install -q --no-deps -r requirements/speculators.txt
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/python collections/install.py
	$(BIN)/ansible-galaxy collection install --offline -r collections/requirements.yml
	touch $@

venv: $(STAMP)

system-deps:
	@bash tests/hosts/install-system-deps.sh

run: $(STAMP)
	$(BIN)/ansible-playbook site.yml $(ARGS)

# the whole lint, one shell line (make lint, and make test beside pytest)
LINT = $(BIN)/ruff check python library module_utils doc_fragments action_plugins callback_plugins tests bench collections \
	&& $(BIN)/ruff format --check python library module_utils doc_fragments action_plugins callback_plugins tests bench collections \
	&& PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/ansible-lint --profile production --offline site.yml playbooks roles \
	&& $(BIN)/python tests/lint/validate_modules.py

lint: $(STAMP)
	$(LINT)

# every list of a phase's options outside its definition (module DOCUMENTATION, doc fragments, role defaults,
# argument_specs, the tasks' pass-through, the bounds table), rewritten between its markers from the definitions
# (eagle3ops.option_render; tests/unit/core/test_options_generated.py fails until it has run)
options: $(STAMP)
	PYTHONPATH=$(CURDIR)/python $(BIN)/python -m eagle3ops.option_render

unit: $(STAMP)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# pytest runs TEST_WORKERS processes (pytest-xdist; grouped so module fixtures are built once, heaviest first:
# tests/conftest.py). The host, ansible and QEMU tests wait on boots, ssh and playbooks far more than they
# compute, so 4 workers on 2 cores pay; TEST_WORKERS=0 runs serially. Lint runs beside pytest (its output
# is printed when it ends; the same commands as `make lint`, not a sub-make, so `make -n test` runs
# nothing). docs/conventions.md "Test time budget" says how to keep `make test` <= 15 min.
TEST_WORKERS ?= 4
# Marker expression of `make test`. The slow integration tests (mark `slow`: whole playbooks, several hosts, the
# real model; ~60 % of the suite's test time) and those that boot systemd-nspawn hosts (mark `nspawn`) run in
# `make test-slow`, CI's second step (.ci/run), so `make test` fits its 15 min. The QEMU VM test
# (mark `qemu`, tests/hosts/test_storage_qemu.py) is in neither: without KVM (no vmx/svm, as on the CI box) its
# TCG guest takes ~20 min and both cores, and slows every other test. `make test-vm` runs it alone;
# `make test TEST_MARKS=` runs everything.
TEST_MARKS ?= not qemu and not slow and not nspawn
SLOW_MARKS ?= (slow or nspawn) and not qemu
# `make test-durations`: the marks and the tests it times (GROUP: a directory or file under tests/)
GROUP ?= tests

test: $(STAMP) system-deps
	@lint_log=$$(mktemp); ( { $(LINT); } > $$lint_log 2>&1; echo $$? > $$lint_log.rc ) & \
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest tests -n $(TEST_WORKERS) -m "$(TEST_MARKS)" $(PYTEST_ARGS); rc=$$?; wait; \
	cat $$lint_log; lint_rc=$$(cat $$lint_log.rc); rm -f $$lint_log $$lint_log.rc; \
	echo "make test: pytest exit $$rc, lint exit $$lint_rc"; [ $$rc -eq 0 ] && [ $$lint_rc -eq 0 ]

# the slow integration tests and the tests that boot systemd-nspawn hosts (CI's second step)
test-slow: $(STAMP) system-deps
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest tests -n $(TEST_WORKERS) -m "$(SLOW_MARKS)" $(PYTEST_ARGS)

# what each test costs, slowest first: every test of GROUP (default: all of make test's and make test-slow's)
# with its setup, call and teardown times over 1 s (docs/conventions.md, "Test time budget")
test-durations: $(STAMP) system-deps
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest $(GROUP) -n $(TEST_WORKERS) -m "not qemu" -q --durations=0 \
		--durations-min=1 $(PYTEST_ARGS)

# the QEMU VM test alone (its TCG guest gets both cores; run it on a quiet box, or on one with KVM)
test-vm: $(STAMP) system-deps
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/pytest tests/hosts/test_storage_qemu.py -m qemu $(PYTEST_ARGS)

# re-pin every installed package (after changing requirements/*.txt on purpose)
lock: $(STAMP)
	{ echo "# Every package of the tested venv, pinned (make lock writes it; make uses it as pip constraints)."; \
	  $(BIN)/pip list --format=freeze --exclude eagle3ops --exclude pip | sed 's/+cpu$$//'; } > requirements/constraints.txt

clean:
	rm -rf work
