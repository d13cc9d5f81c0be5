"""The offline 64-rank plan for the real Qwen3-4B (fake process group, meta device, ~10 s a run)."""

import json
import subprocess
import sys

import pytest
from conftest import keep_plan

from qwen3_pilot import rank_plan
from qwen3_pilot.rank_plan import GIB, run_plan_subprocess

QWEN3_4B_PARAMS = 4_022_468_096


@pytest.fixture(scope="module")
def plan64(tmp_path_factory):
    """The real subprocess's plan and file; the preflight tests after it reuse the plan (conftest.plan_once)."""
    out = tmp_path_factory.mktemp("plan64") / "plan.json"
    plan = run_plan_subprocess("4B", 64, 24, out)
    keep_plan(plan, "4B", 64, 24)
    return plan, out


def test_total_params_and_architecture(plan64):
    plan, _ = plan64
    assert plan["total_params"] == QWEN3_4B_PARAMS
    assert plan["architecture"] == {
        "n_layers": 36,
        "dim": 2560,
        "n_heads": 32,
        "n_kv_heads": 8,
        "head_dim": 128,
        "ffn_hidden_dim": 9728,
        "vocab_size": 151936,
        "tied_embeddings": True,
        "rope_theta": 1_000_000.0,
    }


def test_params_per_rank(plan64):
    plan, _ = plan64
    assert plan["fsdp_degree"] == 64
    assert set(plan["params_per_rank"]) == {"0", "63"}
    for rank, n in plan["params_per_rank"].items():
        assert n == pytest.approx(62.85e6, rel=1e-3), rank
    assert plan["params_per_rank_max"] == max(plan["params_per_rank"].values())


def test_static_memory_fits(plan64):
    plan, _ = plan64
    assert (plan["param_dtype"], plan["grad_dtype"], plan["optimizer_state_dtype"]) == (
        "float32",
        "float32",
        "float32",
    )
    assert plan["optimizer_states_per_param"] == 2
    assert plan["bytes_per_param"] == 16
    assert plan["static_bytes_per_rank"] == 16 * plan["params_per_rank_max"]
    assert plan["static_gib_per_rank"] == pytest.approx(0.94, abs=0.01)
    assert plan["static_gib_per_rank"] == plan["static_bytes_per_rank"] / GIB
    assert plan["hbm_per_rank_gib"] == 24
    assert plan["headroom_gib"] == pytest.approx(24 - plan["static_gib_per_rank"])
    assert plan["fits"] is True


def test_json_written_atomically(plan64):
    plan, out = plan64
    assert [p.name for p in out.parent.iterdir()] == ["plan.json"]  # no temp file left behind
    assert json.loads(out.read_text()) == plan


def test_tiny_budget_fails_naming_the_budget(plan64, tmp_path, monkeypatch):
    """The command's verdict on the 64-rank plan's static state against a budget it exceeds (the plan is the
    fixture's: the command's own subprocess is tested above)."""
    plan, _ = plan64
    monkeypatch.setattr(rank_plan, "build_plan", lambda flavor, world_size, hbm, rank: {
        **plan, **rank_plan.held_to_budget(plan["static_gib_per_rank"], hbm)})
    out = tmp_path / "plan.json"
    with pytest.raises(SystemExit, match=r"DOES NOT FIT.*vs 0\.5 GiB HBM per rank"):
        rank_plan.main(["--hbm-per-rank-gib", "0.5", "--out", str(out)])
    written = json.loads(out.read_text())  # written all the same, for its figures
    assert written["fits"] is False and written["headroom_gib"] == pytest.approx(0.5 - plan["static_gib_per_rank"])


def test_uneven_shards_measured_on_last_rank(tmp_path):
    # 4B's dims all divide by 64, so the real plan is even; at 48 ranks dim-0 chunks are not.
    # Playing the last rank makes the CLI check its real local shards against the metadata.
    plan = run_plan_subprocess("4B", 48, 24, tmp_path / "plan.json", rank=47)
    assert plan["process_rank"] == 47
    first, last = plan["params_per_rank"]["0"], plan["params_per_rank"]["47"]
    assert last < first == plan["params_per_rank_max"]
    assert plan["params_per_rank_min"] == last
    assert plan["static_bytes_per_rank"] == 16 * first


def test_import_does_not_load_torch():
    code = "import sys, qwen3_pilot.rank_plan; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
