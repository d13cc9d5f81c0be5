# Two entry points for a fresh machine: `make report` and `make test`.
# Both create .venv from the hash lock workflow/envs/cpu.lock (made from the pins in workflow/envs/cpu.txt by
# `make lock`) when it is missing or older than the lock: pip checks every file it installs against the lock's sha256.
# pip compiles every module's bytecode as it installs: that is all the bytecode there is where the environment sets
# PYTHONDONTWRITEBYTECODE (this build machine does). Tried without it (--no-compile): the install took 38 s less,
# and `make test` 24 min instead of about 13, every process compiling what it imports.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=
# The trn2 configuration the preflight checks (config/config.yaml with these files laid over it).
TRN2_CONFIG ?= config/trn2.yaml

.PHONY: report report-pdf test test-fast mutations preflight verify signoff lint lock lock-check install-neuron lock-neuron titan-compat unlock clean

$(VENV)/.installed: workflow/envs/cpu.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --require-hashes -r workflow/envs/cpu.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

report: $(VENV)/.installed
	$(BIN)/snakemake --cores all results/report.html $(ARGS)

# results/report.pdf beside the finished report, for a sign-off record: headless Chromium prints the page (A4, the
# decision on page 1, every detail expanded) from a copy held to the sha256 the report stage recorded.
report-pdf: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.tools.report_print pdf results/report.html results/report.pdf

test: $(VENV)/.installed
	$(BIN)/python -m pytest $(ARGS)

# Daily work: every test that needs no pipeline run, torchrun, SLURM, Chromium or network namespaces (pyproject.toml's
# markers). `make test` and CI run everything.
FAST_TESTS = not (e2e or torchrun or slurm or chromium or netns)
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -m "$(FAST_TESTS)" $(ARGS)

# The mutation check: one-line bugs in the code under test (tests/mutations/run.py), each of which the fast tests that
# reach the mutated file must catch; ARGS='--only custody' runs some, ARGS=--list shows each one's test files.
mutations: $(VENV)/.installed
	$(BIN)/python tests/mutations/run.py $(ARGS)

# The trn2 configuration checked on this machine, before renting a trn2: results/preflight/preflight.html.
preflight: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.tools.preflight --configfile $(TRN2_CONFIG) $(ARGS)

# Every artifact results/report.json lists re-checked against the files on disk, and every sign-off against
# the report.json it was given to; non-zero when anything changed.
verify: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.audit verify

# make signoff NAME="A Reviewer" DECISION=approve|reject NOTE="..." -> signoffs/signoffs.jsonl (kept by clean).
# The values reach the command through the environment, never through the shell's parser.
export NAME DECISION NOTE
signoff: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.audit signoff --name "$$NAME" --decision "$$DECISION" --note "$$NOTE"

# After a Snakemake that was killed outright: its lock, cleared only when no process of this workflow is alive
# (each one named otherwise).
unlock: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.unlock $(ARGS)

# workflow/envs/cpu.lock from workflow/envs/cpu.txt: every package pinned with the sha256 of each of its files on the index
# (pip-tools; PyPI must be reachable). Pins already in the lock stay unless workflow/envs/cpu.txt moves them; delete the
# lock first to move every package to the newest its pins allow. Commit both files together.
LOCK_COMMAND = $(BIN)/pip-compile --quiet --allow-unsafe --generate-hashes --no-emit-index-url \
	--no-emit-find-links --strip-extras
lock: $(VENV)/.installed
	$(LOCK_COMMAND) --output-file workflow/envs/cpu.lock workflow/envs/cpu.txt

# CI: the committed lock is what workflow/envs/cpu.txt resolves to (regenerated into a copy, compared).
lock-check: $(VENV)/.installed
	cp workflow/envs/cpu.lock .venv/cpu.lock.check
	$(LOCK_COMMAND) --output-file .venv/cpu.lock.check workflow/envs/cpu.txt
	sed -i 's|--output-file=.venv/cpu.lock.check|--output-file=workflow/envs/cpu.lock|' .venv/cpu.lock.check
	diff -u workflow/envs/cpu.lock .venv/cpu.lock.check || (echo "workflow/envs/cpu.lock is not what workflow/envs/cpu.txt resolves to: run make lock" >&2; exit 1)

# On a trn2: the Neuron SDK release that $(TRN2_CONFIG) names (neuron.sdk, workflow/envs/neuron-sdk/<release>.toml) as AWS
# ships it, into .venv-neuron. The machine is checked first (/etc/os-release, the Python): on the release's DLAMI
# the venv is built on AWS's venv, elsewhere on a supported OS from the standalone wheels with NEURON_PYTHON;
# anything else is refused, naming what it found. Then the release's pip components and workflow/envs/neuron.txt (or the
# release's lock once made) from AWS's repository and PyTorch's CPU index, the TorchTitan Neuron fork cloned into
# vendor/ and installed editable, this project; each step printed before it runs, the installed stack against
# the release at the end. Standard library only: it runs with the machine's python3.
NEURON_SDK ?= $(shell sed -n 's/^  sdk: *"\{0,1\}\([0-9.]*\)"\{0,1\}.*/\1/p' $(TRN2_CONFIG))
NEURON_PYTHON ?= python3
NEURON_VENV ?= .venv-neuron
NEURON_PY ?= $(NEURON_VENV)/bin/python
install-neuron:
	PYTHONPATH=workflow/scripts $(NEURON_PYTHON) -m qwen3_pilot.backends.neuron.stack --sdk $(NEURON_SDK) install \
		--venv $(NEURON_VENV) --python $(NEURON_PYTHON) $(ARGS)

# On the trn2 after install-neuron: workflow/envs/neuron-sdk/<release>.lock (pip-tools, hashes from AWS's and PyTorch's
# indexes too); commit it, and the next install-neuron installs from it.
lock-neuron:
	PYTHONPATH=workflow/scripts $(NEURON_PY) -m qwen3_pilot.backends.neuron.stack --sdk $(NEURON_SDK) lock --venv $(NEURON_VENV)

# The recipes on other torchtitans (recipe x torchtitan -> works / fails, why), in the finished cpu run here
# (make report first): TORCHTITANS="LABEL=PATH ..." with PATH a folder holding a torchtitan package (e.g.
# `git -C <torchtitan clone> archive <commit> torchtitan | tar -x -C PATH`) or a wheel. docs/torchtitan-compat.md.
TORCHTITANS ?=
titan-compat: $(VENV)/.installed
	$(BIN)/python -m qwen3_pilot.tools.titan_compat $(foreach t,$(TORCHTITANS),--torchtitan $(t)) $(ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check workflow/Snakefile workflow/rules

clean:
	rm -rf results logs benchmarks .snakemake
