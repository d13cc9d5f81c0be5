"""The project's command-line tools, each run as `python -m qwen3_pilot.tools.<tool>` (the Makefile's targets):
the trn2 preflight (`make preflight`), the stages' overhead over the work they launch (docs/stages.md), the
report's PDF and screenshots (`make report-pdf`), and the torchtitan compatibility matrix (`make titan-compat`).
They run in a process of their own, outside Snakemake's jobs. The verify and sign-off, `make unlock` and the
Neuron install keep their command lines in their own modules (audit.py, unlock.py, backends/neuron/stack/): the stages
and the rules use those modules too."""
