# Target `archive`, not part of `all`: what the pilot produced copied to archive.destination (a local folder or
# s3://bucket/prefix through Snakemake's S3 storage plugin), read back from there and compared with the
# source. `snakemake --cores 1 archive`; `--forcerun archive` reads the destination back again.
from qwen3_pilot.archive.settings import report_inputs


# Step 1: every artifact report.json lists checked against the sha256 its stage recorded, then the run's
# files copied to <destination>/<run key>/, each with its sha256 at the source in the copy record.
rule archive_copy:
    input:
        # config `archive` checked first: without a destination the run stops before any job
        unpack(lambda wildcards: report_inputs(config["archive"])),
    output:
        record="results/archive/copied.json",
    log:
        "logs/archive/copy.log",
    conda:
        SOFTWARE_ENV
    resources:
        **get_small_resources(),
    params:
        code=get_code("archive_copy.py"),
        settings=config["archive"],
    script:
        "../scripts/archive_copy.py"


# Step 2: every copied file read back from the destination and its sha256 compared with the source's; on a
# full match archive-manifest.json beside the files (and here), else an error naming each file and digest.
rule archive:
    input:
        record="results/archive/copied.json",
    output:
        manifest="results/archive/archive-manifest.json",
        summary="results/archive/summary.json",
    log:
        "logs/archive/archive.log",
    conda:
        SOFTWARE_ENV
    resources:
        **get_small_resources(),
    params:
        code=get_code("archive.py"),
    script:
        "../scripts/archive.py"
