# Everything installs into .venv, once: a target reinstalls only when pyproject.toml or the C source
# changed. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
DEMO_TRACE := build/demo.pftrace
INSTALLED := $(VENV)/.installed
INSTALLED_TEST := $(VENV)/.installed-test

.PHONY: help install install-test demo test test-fast fuzz-verdicts lint proto samples bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 16

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): $(BIN)/python pyproject.toml src/fr2perfetto/_speedups.c
	$(PIP) install -e . 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import fr2perfetto, perfetto, typer"
	@touch $@

$(INSTALLED_TEST): $(BIN)/python pyproject.toml src/fr2perfetto/_speedups.c
	$(PIP) install -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import fr2perfetto, perfetto, typer, torch, pytest, hypothesis"
	@touch $@ $(INSTALLED)

install: $(INSTALLED) ## Install fr2perfetto into .venv (no torch)

install-test: $(INSTALLED_TEST) ## Install fr2perfetto with what the tests need (torch 2.13 CPU, pytest, ruff)

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

# 10,000 generated parallel programs, healthy and faulty: right / undecided / wrong verdicts by fault.
fuzz-verdicts: $(INSTALLED_TEST) ## Judge the verdicts of 10,000 generated programs (FUZZ_ARGS=...)
	$(BIN)/python tests/fuzz_verdicts.py $(FUZZ_ARGS)

lint: $(INSTALLED_TEST) ## ruff: lint and format check
	$(BIN)/ruff check src tests samples bench
	$(BIN)/ruff format --check src tests samples bench

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

clean: ## Remove what builds and benchmarks leave (not .venv)
	rm -rf build dist bench-data .pytest_cache src/fr2perfetto/*.so
