# Everything installs into .venv, once: a target reinstalls only when pyproject.toml or the C source
# changed. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
DEMO_TRACE := build/demo.pftrace
INSTALLED := $(VENV)/.installed
INSTALLED_TEST := $(VENV)/.installed-test

.PHONY: help install install-test demo test test-fast test-oldest fuzz-verdicts lint proto samples bench dist clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 16

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The C module is built in place, as _speedups.abi3.so; one left from a build for a single Python
# (_speedups.cpython-311-*.so) would be imported before it, so the old ones go first.
$(INSTALLED): $(BIN)/python pyproject.toml setup.cfg src/fr2perfetto/_speedups.c
	rm -f src/fr2perfetto/_speedups*.so
	$(PIP) install -e . 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import fr2perfetto, perfetto, typer"
	@touch $@

# What the tests, linters and build need is pyproject's dev dependency group (PEP 735), which pip installs
# from 25.1 on (`--group`): a venv made by an older Python starts with an older pip, so pip comes first.
$(INSTALLED_TEST): $(BIN)/python pyproject.toml setup.cfg src/fr2perfetto/_speedups.c
	$(PIP) install 'pip>=25.1' 2>&1 | grep -v "^WARNING: Location" || true
	rm -f src/fr2perfetto/_speedups*.so
	$(PIP) install --group dev -e . 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import fr2perfetto, perfetto, typer, torch, pytest, xdist, hypothesis, build"
	@touch $@ $(INSTALLED)

install: $(INSTALLED) ## Install fr2perfetto into .venv (no torch)

install-test: $(INSTALLED_TEST) ## Install fr2perfetto with the dev group: what tests need (torch 2.13 CPU, pytest, ruff)

demo: $(INSTALLED) ## Convert and analyze a sample hang; print how to open the trace
	$(BIN)/fr2perfetto convert samples/gloo/skip -o $(DEMO_TRACE)
	@echo
	$(BIN)/fr2perfetto analyze samples/gloo/skip || true
	@echo
	@echo "Trace: $(abspath $(DEMO_TRACE))"
	@echo "Open it: $(BIN)/fr2perfetto open $(DEMO_TRACE)  (or drop it on https://ui.perfetto.dev)"

test: $(INSTALLED_TEST) ## Run every test (real multi-process gloo jobs included: minutes)
	$(BIN)/python -m pytest -q

test-fast: $(INSTALLED_TEST) ## Run the tests that start no torch job and are not slow, on every core (under a minute)
	$(BIN)/python -m pytest -q -n auto -m "not torch_job and not slow"

# The oldest protobuf supported, as a training environment pins it: installing fr2perfetto[capture] keeps it,
# and the capture helper, analyze and convert work on it (tests/test_oldest_protobuf.py).
OLDEST_VENV := .venv-oldest
OLDEST_PROTOBUF := 5.29.5
test-oldest: $(INSTALLED_TEST) ## Check fr2perfetto[capture] beside protobuf $(OLDEST_PROTOBUF), the oldest supported
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip --disable-pip-version-check -q install "protobuf==$(OLDEST_PROTOBUF)" torch==2.13.0 numpy
	$(OLDEST_VENV)/bin/python -m pip --disable-pip-version-check -q install ".[capture]"
	FR2PERFETTO_OLDEST_PYTHON=$(abspath $(OLDEST_VENV))/bin/python $(BIN)/python -m pytest -q tests/test_oldest_protobuf.py

# 10,000 generated parallel programs, healthy and faulty: right / undecided / wrong verdicts by fault.
fuzz-verdicts: $(INSTALLED_TEST) ## Judge the verdicts of 10,000 generated programs (FUZZ_ARGS=...)
	$(BIN)/python tests/fuzz_verdicts.py $(FUZZ_ARGS)

# CI runs it before the tests. mypy checks the package as [tool.mypy] in pyproject.toml says.
lint: $(INSTALLED_TEST) ## ruff (lint and format check) and mypy (the package's types)
	$(BIN)/ruff check src tests samples bench
	$(BIN)/ruff format --check src tests samples bench
	$(BIN)/python -m mypy

proto: $(INSTALLED_TEST) ## Regenerate the committed protobuf modules from proto/
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=src/fr2perfetto/proto --pyi_out=src/fr2perfetto/proto proto/fr2perfetto_report.proto

samples: $(INSTALLED_TEST) ## Re-make the bundled samples: real gloo jobs and NCCL-layout dumps
	rm -rf samples/gloo samples/nccl
	$(BIN)/python samples/gloo_jobs.py samples/gloo healthy skip skip_subgroup deadlock size_mismatch dtype_mismatch type_mismatch order_swap data_ops grid_3d grid_3d_skip
	$(BIN)/python samples/gloo_failures.py samples/gloo torchrun_abort checkpoint_hang pair_skip
	$(BIN)/python samples/gloo_pipeline.py samples/gloo pipeline_stopped
	$(BIN)/python samples/gloo_pipeline.py samples/gloo pipeline_healthy
	$(BIN)/python samples/nccl_layout.py samples/nccl
	$(BIN)/python samples/nccl_sim.py samples/nccl

bench: $(INSTALLED_TEST) ## Time convert and analyze against unpickling alone (BENCH_ARGS=...)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# The release archives, made and checked as a user meets them: the sdist, and the wheel built from it,
# cp310-abi3 (one wheel for every CPython from 3.10 on) and repaired by auditwheel to a manylinux tag
# (Linux only). The tools are pyproject's dist group, in a venv of their own; the wheel is then installed,
# with its dependencies, into a fresh venv with what the tests need (the dev group: torch pinned to
# 2.13.0 CPU), and the fast tests run there from this folder, where the src layout leaves only the
# installed package to import. A wheel built outside a manylinux image is tagged by what it links: this
# one needs glibc 2.17, and auditwheel refuses a module that needs more.
DIST_VENV := .venv-dist
DIST_BIN := $(DIST_VENV)/bin
DIST_INSTALLED := $(DIST_VENV)/.installed
DIST_TEST_VENV := .venv-dist-test
DIST_TEST_BIN := $(DIST_TEST_VENV)/bin
DIST_PIP = -m pip --disable-pip-version-check -q

$(DIST_INSTALLED): pyproject.toml
	rm -rf $(DIST_VENV)
	$(PYTHON) -m venv $(DIST_VENV)
	$(DIST_BIN)/python $(DIST_PIP) install 'pip>=25.1' 2>&1 | grep -v "^WARNING: Location" || true
	$(DIST_BIN)/python $(DIST_PIP) install --group dist 2>&1 | grep -v "^WARNING: Location" || true
	@$(DIST_BIN)/python -c "import build, auditwheel, abi3audit, twine"
	@touch $@

dist: $(DIST_INSTALLED) ## Build sdist + manylinux abi3 wheel into dist/, check them, run the fast tests (test_packaging among them) on the installed wheel
	rm -rf dist build/dist-raw $(DIST_TEST_VENV)
	mkdir -p build/dist-raw
	@# The builder's Python may link modules with an rpath to its own folder (pyenv's does): left out, the
	@# wheel names no folder of this machine. What the tools say goes to a log, shown where they fail.
	LDSHARED="$$($(DIST_BIN)/python -c 'import re, sysconfig; print(re.sub(r"\s*-Wl,-rpath,\S+", "", sysconfig.get_config_var("LDSHARED")))')" \
		$(DIST_BIN)/python -m build --outdir build/dist-raw . >build/dist-raw/build.log 2>&1 \
		|| { tail -n 40 build/dist-raw/build.log; exit 1; }
	@tail -n 1 build/dist-raw/build.log
	PATH="$(abspath $(DIST_BIN)):$$PATH" $(DIST_BIN)/auditwheel repair --wheel-dir dist build/dist-raw/*.whl \
		>build/dist-raw/repair.log 2>&1 || { tail -n 40 build/dist-raw/repair.log; exit 1; }
	@grep -E "New WHEEL info tags|Fixed-up wheel" build/dist-raw/repair.log
	mv build/dist-raw/*.tar.gz dist/
	$(DIST_BIN)/abi3audit --strict --summary dist/*.whl
	$(DIST_BIN)/twine check --strict dist/*
	$(PYTHON) -m venv $(DIST_TEST_VENV)
	$(DIST_TEST_BIN)/python $(DIST_PIP) install 'pip>=25.1' 2>&1 | grep -v "^WARNING: Location" || true
	$(DIST_TEST_BIN)/python $(DIST_PIP) install dist/*.whl 2>&1 | grep -v "^WARNING: Location" || true
	$(DIST_TEST_BIN)/python $(DIST_PIP) install --group dev 2>&1 | grep -v "^WARNING: Location" || true
	$(DIST_TEST_BIN)/python -c 'import sysconfig, fr2perfetto; from fr2perfetto.base.speedups import SPEEDUPS; assert fr2perfetto.__file__.startswith(sysconfig.get_paths()["platlib"]), fr2perfetto.__file__; assert SPEEDUPS is not None and SPEEDUPS.__file__.endswith(".abi3.so"), "no C module"; print("testing", fr2perfetto.__file__, "with", SPEEDUPS.__file__)'
	FR2PERFETTO_DIST=$(abspath dist) $(DIST_TEST_BIN)/python -m pytest -q -n auto -m "not torch_job and not slow"
	@ls -l dist

clean: ## Remove what builds and benchmarks leave (not .venv)
	rm -rf build dist bench-data .pytest_cache src/fr2perfetto/*.so
