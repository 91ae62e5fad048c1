# Two commands for a newcomer: `make demo` and `make test`. Both bootstrap a virtualenv from
# pyproject.toml on first use (and again whenever pyproject.toml changes).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit prereqs bench clean

prereqs:
	@sh tools/check-prereqs.sh "$(PYTHON)"

$(STAMP): pyproject.toml
	@sh tools/check-prereqs.sh "$(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: prereqs $(STAMP)
	$(PY) examples/quickstart.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -m "not spark and not integration"

test: prereqs $(STAMP) lint typecheck
	$(VENV)/bin/pytest --durations=15

bench: prereqs $(STAMP)
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/commit_latency.py
	$(PY) benchmarks/commit_latency.py 30 --s3
	$(PY) benchmarks/s3_staging.py
	$(PY) benchmarks/async_writer_overhead.py
	$(PY) benchmarks/async_congestion.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
