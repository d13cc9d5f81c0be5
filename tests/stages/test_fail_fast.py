"""Stage fail_fast's parts that need no launch: the tiny run it lays over each recipe's settings (exactly the keys
its params leave out), a check's row whether it passes or raises, and the deciding line of a pass and of a failure.
The stage itself, failing first for a torchtitan that lacks a recipe's name: tests/e2e/test_fail_fast_e2e.py."""

from __future__ import annotations

from conftest import default_config

from qwen3_pilot.decisions import deciding_figure
from qwen3_pilot.parse_time.config import FAIL_FAST_OWN_KEYS, fail_fast_training
from qwen3_pilot.stages.fail_fast import timed_check, tiny_training

SETTINGS = {"steps": 2, "ranks": 2, "seq_len": 256}


def test_the_tiny_run_sets_exactly_the_keys_its_params_leave_out():
    config = default_config()
    # What it lays over any recipe: a key it sets but the params keep (say the seed) would rerun fail_fast for an
    # edit that changes none of its launches.
    assert set(tiny_training({}, SETTINGS)) == set(FAIL_FAST_OWN_KEYS)
    training = fail_fast_training(config)
    assert set(training) == {"train_native", "train_hf", "moe_reduced"}
    for stage, settings in training.items():
        assert not set(FAIL_FAST_OWN_KEYS) & set(settings), stage
        tiny = tiny_training(settings, SETTINGS)
        assert set(tiny) - set(settings) == set(FAIL_FAST_OWN_KEYS), stage
        assert (tiny["steps"], tiny["seq_len"], tiny["local_batch_size"], tiny["global_batch_size"]) == (2, 256, 1, 2)
        assert tiny["native_flavor"] is None and tiny["attention"] == config["training"]["attention"]


def test_a_check_that_raises_is_a_failed_row_and_the_next_check_still_runs():
    logged = []

    def broken():
        raise KeyError("transformers_modeling_backend_full")

    rows = [timed_check("recipe", "train_hf", broken, logged.append),
            timed_check("recipe", "train_native", lambda: {"losses": [7.6, 7.5]}, logged.append)]
    assert rows[0]["status"] == "fail" and rows[0]["error"] == "KeyError: 'transformers_modeling_backend_full'"
    assert rows[0]["result"] is None and rows[0]["seconds"] >= 0
    assert rows[1]["status"] == "pass" and rows[1]["result"] == {"losses": [7.6, 7.5]} and rows[1]["error"] is None
    assert logged[0].startswith("recipe train_hf: fail in ") and "KeyError" in logged[0]


def test_the_deciding_line_names_what_failed_and_after_how_long():
    checks = [{"kind": "recipe", "name": "train_native", "status": "pass", "seconds": 11.0, "error": None},
              {"kind": "recipe", "name": "train_hf", "status": "fail", "seconds": 0.4,
               "error": "TorchtitanApiError: the installed torchtitan lacks 1 name(s) the recipe qwen3_hf uses"}]
    failed = {"stage": "fail_fast", "status": "fail", "figures": {"reason": "FailFastError: ...", "checks": checks}}
    assert deciding_figure(failed) == ("recipe train_hf failed after 0.4 s: TorchtitanApiError: the installed "
                                       "torchtitan lacks 1 name(s) the recipe qwen3_hf uses")
    checks[1].update(status="pass", error=None)
    passed = {"stage": "fail_fast", "status": "pass",
              "figures": {"checks": checks, "steps": 2, "ranks": 2, "compile_backend": "aot_eager", "seconds": 30.5}}
    assert deciding_figure(passed) == ("2 of 2 checks in 30.5 s: 2 recipes on 2 ranks, the kernels compiled with "
                                       "aot_eager")
