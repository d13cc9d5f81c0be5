# The audit trail: results/report.json and results/report.html, built from the stage summaries only: seconds of
# work on records, where Snakemake runs (never a cluster job).
localrules:
    report,


rule report:
    input:
        **get_stage_summaries(),
        page=get_report_page_templates(),
    output:
        html=report(
            "results/report.html",
            caption="../report/report.rst",
            category="Pilot",
        ),
        json="results/report.json",
    log:
        "logs/report/report.log",
    conda:
        SOFTWARE_ENV
    params:
        code=get_code("report.py"),
        # Not `archive`: where a finished run is copied is not part of it (qwen3_pilot.archive.settings.pilot_config).
        config=pilot_config(config),
        config_digest=config_digest(pilot_config(config)),
        backend=BACKEND,
    script:
        "../scripts/report.py"


# The report tells which stages this invocation ran and why, from Snakemake's own plan.
onstart:
    record_invocation_plan()


onsuccess:
    forget_invocation_plan()


# After any failed run the reviewer still gets a report: the failed stages with their reasons and figures,
# the stages they blocked, an overall fail. Snakemake still exits non-zero.
onerror:
    write_failed_report()
    forget_invocation_plan()
