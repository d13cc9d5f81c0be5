"""Switching the Neuron SDK release (config neuron.sdk, one line) on a finished trn2 run reruns exactly the jobs
docs/reruns.md lists, each for the reason it gives: the stamps of the components whose version moved (their
params), and what reads those stamps. Nothing else: the corpus, the weights and the stamps of the packages the
release does not ship stay cached.

The finished trn2 run is made here, as no trn2 is reachable: every output the neuron DAG plans is created empty
and Snakemake's --touch records each job as run with the 2.33.0 release (its params and inputs, in
.snakemake/metadata), as a run on the instance would have left them. The plan is Snakemake's own (`-n`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import JOB_BLOCK, PROJECT, make_workspace, output, run_snakemake

TABLE = PROJECT / "docs" / "reruns.md"
SECTION = "## Switching the Neuron SDK release"
TRN2 = ("--configfile", "config/trn2.yaml")


def documented_plan() -> dict[str, str]:
    """The section's table: {job as rule[wildcard]: the reason it gives}."""
    text = TABLE.read_text()
    section = text[text.index(SECTION):].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def planned_reasons(result) -> dict[str, str]:
    """A dry run's jobs as rule[wildcard] with Snakemake's reason, the target rule `all` left out."""
    jobs, rule, reason, wildcards = {}, None, "", ""
    for line in (result.stdout + result.stderr).splitlines() + [""]:
        if block := JOB_BLOCK.match(line):  # a checkpoint's job (fail_fast) too
            rule, reason, wildcards = block.group(1), "", ""
        elif rule and line.strip().startswith("reason:"):
            reason = line.split(":", 1)[1].strip()
        elif rule and line.strip().startswith("wildcards:"):
            wildcards = "".join(f"[{pair.split('=', 1)[1]}]" for pair in line.split(":", 1)[1].strip().split(", "))
        elif rule and not line.startswith(" "):
            if rule != "all":
                jobs[rule + wildcards] = reason
            rule = None
    return jobs


@pytest.fixture(scope="module")
def finished_trn2_run(tmp_path_factory) -> Path:
    ws = make_workspace(tmp_path_factory.mktemp("trn2") / "ws")
    summary = run_snakemake(ws, "-n", "--summary", *TRN2)
    assert summary.returncode == 0, output(summary)[-3000:]
    rules = "".join(path.read_text() for path in (ws / "workflow" / "rules").glob("*.smk"))
    folders = [re.sub(r"\{[^}]+\}", "[^/]+", d) for d in re.findall(r'directory\("([^"]*)"\)', rules)]
    for line in summary.stdout.splitlines()[1:]:
        path = line.split("\t")[0]
        if not path.startswith("results/"):
            continue
        if any(re.fullmatch(folder, path) for folder in folders):
            (ws / path).mkdir(parents=True, exist_ok=True)
        else:
            (ws / path).parent.mkdir(parents=True, exist_ok=True)
            (ws / path).touch()
    touched = run_snakemake(ws, "--touch", "--forceall", "--cores", "1", "results/report.html", *TRN2)
    assert touched.returncode == 0, output(touched)[-3000:]
    unchanged = run_snakemake(ws, "-n", "results/report.html", *TRN2)
    assert "Nothing to be done" in output(unchanged), output(unchanged)[-3000:]
    return ws


def test_switching_to_2_34_0_plans_the_jobs_docs_reruns_md_lists_each_for_its_reason(finished_trn2_run, tmp_path):
    switch = tmp_path / "sdk.yaml"
    switch.write_text('neuron:\n  sdk: "2.34.0"\n')
    result = run_snakemake(finished_trn2_run, "-n", "results/report.html", *TRN2, str(switch))
    assert result.returncode == 0, output(result)[-3000:]
    planned, documented = planned_reasons(result), documented_plan()
    assert set(planned) == set(documented), output(result)[-4000:]
    for job, why in documented.items():
        if why.startswith("params:"):  # the stamp of a component that moved: its pin before and now
            assert planned[job].startswith("Params have changed since last execution"), (job, planned[job])
            for value in re.findall(r"`([^`]+)`", why):
                assert value in planned[job], (job, value, planned[job])
        else:
            assert why.startswith("input:") and planned[job].startswith("Input files updated by another job"), job
    # What the release does not ship stays cached: the data, the weights, and every other package's stamp.
    kept = {"fetch_corpus", "fetch_weights", "pin_package[transformers]", "pin_package[huggingface-hub]"}
    assert not kept & set(planned)


def test_a_release_with_2_33_0s_versions_under_another_name_reruns_only_pin_envs_record(finished_trn2_run,
                                                                                        tmp_path):
    """The stamps' params are the components' versions, not the release's name: a release that moves no
    version (say a rebuilt file for a patch release that changed nothing the pilot uses) reruns pin_env, whose
    record names the release, and the report; no stamp and no stage."""
    releases = finished_trn2_run / "workflow" / "envs" / "neuron-sdk"
    (releases / "2.33.9.toml").write_text((releases / "2.33.0.toml").read_text().replace(
        'release = "2.33.0"', 'release = "2.33.9"'))
    switch = tmp_path / "sdk.yaml"
    switch.write_text('neuron:\n  sdk: "2.33.9"\n')
    try:
        result = run_snakemake(finished_trn2_run, "-n", "results/report.html", *TRN2, str(switch))
    finally:
        (releases / "2.33.9.toml").unlink()
    assert result.returncode == 0, output(result)[-3000:]
    assert set(planned_reasons(result)) == {"pin_env", "report"}, output(result)[-3000:]
