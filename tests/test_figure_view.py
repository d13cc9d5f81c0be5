"""The page's one formatting layer (qwen3_pilot.figure_view): labels with units, digits that fit the figure, exact
values untouched, nested records as labelled tables."""

from __future__ import annotations

from qwen3_pilot.figure_view import blocks, label, text


def test_labels_carry_the_unit_their_key_names():
    assert label("mean_step_time_s_after_step_1") == "mean step time after step 1 (s)"
    assert label("peak_memory_gib_per_rank") == "peak memory per rank (GiB)"
    assert label("tokens_per_s_per_rank") == "tokens/s per rank"
    assert label("mfu_pct") == "MFU (%)"
    assert label("step1_loss_loaded") == "step1 loss loaded (nats)"
    assert label("fetched weights") == "fetched weights"  # not an identifier: as recorded


def test_numbers_get_the_digits_that_fit_them_and_exact_values_stay_as_recorded():
    assert text("loss", 5.459681510925293) == "5.46"
    assert text("final_loss", 4.391976356506348) == "4.392"
    assert text("step_time_s", 0.08479233477798213) == "0.0848"
    assert text("mfu_pct", 9.65762209571158) == "9.7"
    assert text("peak_flops_per_rank", 180757028539.16614) == "1.81e+11"
    assert text("parameters", 1906330624) == "1,906,330,624"
    assert text("tolerance", 1e-06) == "1e-06" and text("min_gap", 1.0) == "1.0"
    assert text("rope_theta", 1000000.0) == "1000000.0"
    assert text("source_sha256", "ab" * 32) == "ab" * 32
    assert text("fits", True) == "yes" and text("fallback_reason", None) == "none"
    assert text("tokens_per_expert", list(range(64))) == "64 values: min 0, median 31.5, max 63"
    assert text("shape", [2, 256, 4, 64]) == "2, 256, 4, 64"


def as_text(block):
    return [block.columns, *[[cell.text for cell in row] for row in block.rows]]


def test_nested_records_become_labelled_tables():
    figures = {
        "gate": {"gap": 2.1852378845214844, "min_gap": 1.0},
        "launch_wall_s": {"fetched weights": 9.96},
        "hf": {"max_abs_diff": 0.0, "tolerance": 1e-4}, "native": {"max_abs_diff": 1e-7, "tolerance": 1e-4},
        "steps": [{"step": 1, "loss": 5.4597, "step_time_s": 0.36}, {"step": 2, "loss": 5.141, "step_time_s": 0.12}],
    }
    pairs, recipes, steps = blocks(figures)
    assert as_text(pairs) == [[], ["gate > gap (nats)", "2.185"], ["gate > min gap (nats)", "1.0"],
                              ["launch wall > fetched weights (s)", "9.96"]]
    assert recipes.caption == "HF, native"
    assert as_text(recipes) == [["", "max |diff|", "tolerance"], ["hf", "0", "0.0001"], ["native", "1e-07", "0.0001"]]
    assert steps.caption == "steps"
    assert as_text(steps) == [["step", "loss (nats)", "step time (s)"], ["1", "5.46", "0.36"], ["2", "5.141", "0.12"]]


def test_a_table_with_more_columns_than_rows_is_turned_on_its_side():
    row = {"run": "eager", **{f"figure_{n}_s": n / 3 for n in range(9)}}
    [table] = blocks({"table": [row, {**row, "run": "compiled"}]})
    assert table.columns == ["run", "eager", "compiled"]
    assert [cell.text for cell in table.rows[1]] == ["figure 1 (s)", "0.333", "0.333"]
    assert len(table.rows) == 9
