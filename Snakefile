# Qwen3 on AWS Trainium: the pilot workflow. `snakemake --cores 1 results/report.html`
# (README.md: setup; config/README.md: the keys; docs/design.md: the design).
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/env.smk"
include: "rules/data.smk"
include: "rules/ranks.smk"
include: "rules/train.smk"
include: "rules/benchmark.smk"
include: "rules/report.smk"
include: "rules/archive.smk"


rule all:
    default_target: True
    input:
        "results/report.html",
