"""What runs when Snakemake reads the workflow, or in Snakemake's own process around the jobs
(workflow/rules/common.smk): the configuration's checks beyond the schema and the per-stage params built from it
(config.py), the digest of each stage's code that decides its reruns (code.py), and the record of the invocation's plan
(plan.py).
Torch-free: the Snakefile parses in well under a second.

The stage list is the stages' own (qwen3_pilot.stages); the stage processes import config.py's constants and
helpers too (config.deep_update). The configured backend's own rules are its config_problems (backends/).
"""
