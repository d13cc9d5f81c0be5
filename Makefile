# Two entry points for a fresh machine: `make report` and `make test`.
# Both create .venv from envs/cpu.txt when it is missing or older than the pins.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: report test lint clean

$(VENV)/.installed: envs/cpu.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r envs/cpu.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

report: $(VENV)/.installed
	$(BIN)/snakemake --cores all results/report.html $(ARGS)

test: $(VENV)/.installed
	$(BIN)/python -m pytest $(ARGS)

lint: $(VENV)/.installed
	$(BIN)/snakemake --lint

clean:
	rm -rf results logs benchmarks .snakemake
