# Set-up is two commands: `make demo` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
DEMO_TRACE := build/demo.pftrace

.PHONY: install install-test demo test fuzz-verdicts lint proto samples bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) install -e . 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import fr2perfetto, perfetto, typer"

install-test: $(BIN)/python
	$(PIP) install -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
	@$(BIN)/python -c "import fr2perfetto, perfetto, typer, torch, pytest, hypothesis"

demo: install
	$(BIN)/fr2perfetto convert samples/gloo/skip -o $(DEMO_TRACE)
	@echo
	$(BIN)/fr2perfetto analyze samples/gloo/skip || true
	@echo
	@echo "Trace: $(abspath $(DEMO_TRACE))"
	@echo "Open https://ui.perfetto.dev and drop the file on it (or: Open trace file)."

test: install-test
	$(BIN)/python -m pytest -q

# 10,000 generated parallel programs, healthy and faulty: right / undecided / wrong verdicts by fault.
fuzz-verdicts: install-test
	$(BIN)/python tests/fuzz_verdicts.py $(FUZZ_ARGS)

lint: install-test
	$(BIN)/ruff check fr2perfetto tests samples bench
	$(BIN)/ruff format --check fr2perfetto tests samples bench

# Regenerate the committed protobuf modules from proto/.
proto: install-test
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=fr2perfetto/proto --pyi_out=fr2perfetto/proto proto/fr2perfetto_report.proto

# Re-make the bundled samples: real gloo jobs (needs torch) and NCCL-layout dumps.
samples: install-test
	rm -rf samples/gloo samples/nccl
	$(BIN)/python samples/gloo_jobs.py samples/gloo healthy skip skip_subgroup deadlock size_mismatch dtype_mismatch type_mismatch order_swap data_ops grid_3d grid_3d_skip
	$(BIN)/python samples/gloo_pipeline.py samples/gloo pipeline_stopped
	$(BIN)/python samples/gloo_pipeline.py samples/gloo pipeline_healthy
	$(BIN)/python samples/nccl_layout.py samples/nccl
	$(BIN)/python samples/nccl_sim.py samples/nccl

bench: install-test
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf build bench-data .pytest_cache fr2perfetto/*.so
