# Two entry points for a fresh machine: `make report` and `make test`.
# Both create .venv from envs/cpu.txt when it is missing or older than the pins.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=
# The trn2 configuration the preflight checks (config/config.yaml with these files laid over it).
TRN2_CONFIG ?= config/trn2.yaml

.PHONY: report test preflight verify signoff lint clean

$(VENV)/.installed: envs/cpu.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r envs/cpu.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

report: $(VENV)/.installed
	$(BIN)/snakemake --cores all results/report.html $(ARGS)

test: $(VENV)/.installed
	$(BIN)/python -m pytest $(ARGS)

# The trn2 configuration checked on this machine, before renting a trn2: results/preflight/preflight.html.
preflight: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.preflight --configfile $(TRN2_CONFIG) $(ARGS)

# Every artifact results/report.json lists re-checked against the files on disk, and every sign-off against
# the report.json it was given to; non-zero when anything changed.
verify: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.audit verify

# make signoff NAME="A Reviewer" DECISION=approve|reject NOTE="..." -> signoffs/signoffs.jsonl (kept by clean).
# The values reach the command through the environment, never through the shell's parser.
export NAME DECISION NOTE
signoff: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.audit signoff --name "$$NAME" --decision "$$DECISION" --note "$$NOTE"

lint: $(VENV)/.installed
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile rules

clean:
	rm -rf results logs benchmarks .snakemake
