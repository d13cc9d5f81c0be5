"""The report's first table (qwen3_pilot.decisions): each stage's deciding figure in words, with units and its
threshold, at digits that fit the figure; a failed stage's reason where its figure is missing."""

from __future__ import annotations

import pytest

from qwen3_pilot.decisions import deciding_figure, duration, number, other_commits


@pytest.mark.parametrize("value, digits, text", [
    (0.0, 3, "0"), (2.5506515502929688, 3, "2.55"), (7.643583297729492, 4, "7.644"), (3216.2119206432935, 3, "3,216"),
    (1e-06, 3, "1e-06"), (0.0001, 3, "0.0001"), (1906330624.0, 3, "1.91e+09"), (100.0, 3, "100"),
])
def test_numbers_get_the_digits_that_fit_them(value, digits, text):
    assert number(value, digits) == text


def test_a_training_stage_is_decided_by_its_gate_against_the_threshold():
    stage = {"stage": "train_native", "figures": {"gate": {
        "step1_loss_loaded": 5.092931747436523, "step1_loss_random_init": 7.643583297729492,
        "gap": 2.5506515502929688, "min_gap": 1.0}}}
    assert deciding_figure(stage) == "step-1 loss 5.093 vs random-init 7.644: gap 2.55 nats, needs >= 1"


def test_kernel_replacements_are_held_to_the_tolerance_their_judge_recorded():
    replacements = {"per_kernel": {"rope_hf": {"replaced": 4}, "moe_grouped_experts": {"replaced": 4}},
                    "against_plain": {"max_abs_loss_diff": 1.9073486328125e-06, "tolerance": 0.001}}
    figures = {"parameters": 1234567, "full_width_parameters": 1906330624, "first_loss": 7.61, "final_loss": 6.5,
               "kernel_replacements": replacements}
    stage = {"stage": "moe_reduced", "figures": figures}
    assert deciding_figure(stage) == ("1,234,567 parameters (1,906,330,624 at full width); loss 7.61 -> 6.5 nats; "
                                      "rope_hf x 4, moe_grouped_experts x 4 (1 per layer); loss vs the plain run max "
                                      "|diff| 1.91e-06 nats, needs <= 0.001")


def test_a_failed_stage_without_its_figure_shows_its_reason_and_an_unknown_one_points_to_details():
    failed = {"stage": "train_hf", "figures": {"reason": "torchrun was killed by signal 9"}}
    assert deciding_figure(failed) == "torchrun was killed by signal 9"
    assert deciding_figure({"stage": "archive", "figures": {}}) == "see details"
    assert deciding_figure({"stage": "benchmark", "status": "not_run"}) == "see details"


def test_durations_come_from_the_recorded_start_and_end():
    assert duration({"started": "2026-12-04T18:11:05.333+00:00", "ended": "2026-12-04T18:12:30.632+00:00"}) == \
        "1 min 25 s"
    assert duration({"started": "2026-12-04T18:10:13.733+00:00", "ended": "2026-12-04T18:10:13.950+00:00"}) == "0.22 s"
    assert duration({"status": "not_run"}) == ""


def test_a_preflight_check_shows_its_figure_or_the_first_line_of_its_error():
    from qwen3_pilot.decisions import preflight_figure

    plan = {"status": "pass", "figures": {"world_size": 64, "static_gib_per_rank": 0.93652, "hbm_per_rank_gib": 24}}
    assert preflight_figure("fsdp_plan", plan) == ("64-rank FSDP plan: 0.937 GiB per rank (parameters, gradients, "
                                                   "AdamW state), budget 24 GiB")
    failed = {"status": "fail", "error": "PreflightError: the 4B FSDP plan needs 30 GiB per rank\nmore"}
    assert preflight_figure("fsdp_plan", failed) == "PreflightError: the 4B FSDP plan needs 30 GiB per rank"
    assert preflight_figure("fsdp_plan", {"status": "pass", "figures": {}}) == "see details"


def test_the_benchmarks_deciding_figure_adds_the_projected_full_run_where_there_is_one():
    row = {"recipe": "train_native", "run": "eager", "median_step_s": 0.25, "tokens_per_s_per_rank": 1024.0,
           "mfu_pct": 12.5}
    figures = {"table": [row], "projection": "not projected: set benchmark.budget.tokens", "price": "not priced"}
    measured = "train_native: steady step 0.25 s median, 1,024 tokens/s per rank, MFU 12 %"
    assert deciding_figure({"stage": "benchmark", "status": "pass", "figures": figures}) == measured
    figures |= {"price": {"currency": "USD"}, "projection": {"basis": "...", "rows": [
        {"recipe": "train_native", "scaling_efficiency": 0.9, "wall_time_days": 12.5, "cost": 41_000.0}]}}
    assert deciding_figure({"stage": "benchmark", "status": "pass", "figures": figures}) == (
        f"{measured}; full run projected (train_native, 90 % scaling): 12.5 days, cost 41,000 USD")


def test_a_stage_made_by_the_code_of_another_commit_says_so():
    """The page names the commit of a record reused from older code (and a judged stage's measurement at its own
    commit); a record made by the report's own commit adds nothing."""
    run = {"commit": "f" * 40, "dirty": False}
    same = {"digest": "a" * 64, "commit": "f" * 40, "dirty": False}
    assert other_commits({"code": same}, run) == []
    assert other_commits({}, run) == []  # a stage that did not run
    older = {"digest": "a" * 64, "commit": "0" * 40, "dirty": True, "measured": {**same, "commit": "1" * 40}}
    assert other_commits({"code": older}, run) == ["measured at commit 111111111111",
                                                   "judged at commit 000000000000 with uncommitted changes"]
    # The report's own commit, but uncommitted changes the report did not have.
    assert other_commits({"code": {**same, "dirty": True}}, run) == [
        "made at commit ffffffffffff with uncommitted changes"]


def test_the_corpus_is_decided_by_its_split_and_the_digest_it_was_checked_against():
    split = {"documents": 2026, "heldout": {"documents": 106, "every": 20}, "bytes": 2_100_000}
    local = {"stage": "fetch_corpus", "figures": {**split, "source_sha256": "ab" * 32}}
    assert deciding_figure(local) == "2,026 training + 106 held-out documents, 2.1 MB, sha256 abababababab..."
    download = {"stage": "fetch_corpus",
                "figures": {**split, "git_blob_sha1": "3dac4f760dd949a4bbd4d0080a11ea122d90f831"}}
    assert deciding_figure(download).endswith("MB, git blob sha1 3dac4f760dd9...")


def test_the_ranks_row_counts_the_sizes_the_judge_found_at_or_above_their_floor():
    rows = [{"collective": "all_reduce", "size_mib": 1.0, "busbw_gbps": 0.5, "floor_gbps": None,
             "verdict": "shown, not held (below 4 MiB)"},
            {"collective": "all_reduce", "size_mib": 4.0, "busbw_gbps": 2.0, "floor_gbps": 1.0,
             "verdict": "at or above the floor"},
            {"collective": "all_gather", "size_mib": 4.0, "busbw_gbps": 0.5, "floor_gbps": 1.0,
             "verdict": "BELOW THE FLOOR"}]
    figures = {"live": {"ranks_seen": 2, "expected_ranks": 2, "bandwidth": rows},
               "plan": {"world_size": 64, "flavor": "4B", "static_gib_per_rank": 2.3, "hbm_per_rank_gib": 24},
               "floor": {"from_mib": 4, "basis": "a test's"}}
    assert deciding_figure({"stage": "verify_ranks", "figures": figures}).endswith("; floor met at 1 of 2 sizes")
