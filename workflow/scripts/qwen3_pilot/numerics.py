"""The `kernel_numerics` stage's measurements: the RoPE custom op against torchtitan's own RoPE, the
grouped-matmul experts against a per-expert loop, the NKI sequence-length rule, and tiny torchtitan Qwen3
models (dense and MoE) trained with and without the kernel replacements, eager and under torch.compile.

Every function returns plain JSON-serialisable data; `kernel_numerics(config)` runs them all and lists
every check that failed under "problems". The implementations under test are parameters, so a test can
hand in a wrong one and see the check fail.

Settings: config `kernel_numerics` (every key and its default, with the reasons, in the config schema:
rope and moe shapes, dtypes and tolerances, the tiny models trained, torch.compile's check; a RoPE tolerance
"bf16_stepwise" is derived per shape, see bf16_stepwise_rope_bound), plus what the stage adds: `lnc` (the
neuron LNC whose sequence rule the models and the rule check enforce), `device` (the backend's; its kernels
are installed first) and `compile.cache_dir`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

_log = logging.getLogger(__name__)

# ---- comparison rows ----


def max_abs_diff(actual, expected) -> float:
    if actual.numel() == 0:
        return 0.0
    return float((actual.float() - expected.float()).abs().max())


def comparison_row(op: str, dtype: str, shape, actual, expected, tolerance: float, **extra) -> dict[str, Any]:
    diff = max_abs_diff(actual, expected)
    # NaN compares false, so a NaN difference fails.
    verdict = "pass" if diff <= tolerance else "fail"
    return {"op": op, "dtype": dtype, "shape": list(shape), "max_abs_diff": diff, "tolerance": tolerance,
            "verdict": verdict, **extra}


def row_problems(section: str, rows: list[dict[str, Any]]) -> list[str]:
    return [
        f"{section}: {row['op']} {row['dtype']} shape {row['shape']}"
        + (f" ({row['impl']} vs {row['reference']})" if "impl" in row else "")
        + f": max abs diff {row['max_abs_diff']:.3g} > tolerance {row['tolerance']:.3g}"
        for row in rows
        if row["verdict"] != "pass"
    ]


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


# ---- RoPE ----


def rope_numerics(
    shapes: list[dict[str, int]],
    dtypes: list[str],
    tolerances: dict[str, float],
    rope_apply: Callable | None = None,
    theta: float = 1000000.0,
    seed: int = 0,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """`HFLayoutRoPE` around `rope_apply` (default: the `qwen3_pilot::rope_hf` op in torchtitan layout, i.e.
    the backend's kernel) against torchtitan's `CosSinRoPE`, forward outputs and input gradients for q and
    k, on `device`. A tolerance of "bf16_stepwise" is derived per shape by `bf16_stepwise_rope_bound`."""
    from torchtitan.models.common.rope import CosSinRoPE

    from qwen3_pilot.titan.kernels.rope import HFLayoutRoPE, rope_titan_layout

    rows = []
    for shape in shapes:
        rope_args = {"dim": shape["head_dim"], "max_seq_len": shape["seq"], "theta": theta}
        reference = CosSinRoPE(CosSinRoPE.Config(**rope_args)).to(device)
        replaced = HFLayoutRoPE(HFLayoutRoPE.Config(**rope_args)).to(device)
        replaced.apply_rope = rope_apply or rope_titan_layout
        for dtype in dtypes:
            inputs = [t.to(device) for t in _rope_inputs(shape, _dtype(dtype), seed)]
            expected = _rope_forward_backward(reference, *inputs)
            actual = _rope_forward_backward(replaced, *inputs)
            tolerance = tolerances[dtype]
            if tolerance == "bf16_stepwise":
                tolerance = bf16_stepwise_rope_bound(max(float(t.abs().max()) for t in inputs))
            for op, got, want in zip(("rope_forward_q", "rope_forward_k", "rope_grad_q", "rope_grad_k"),
                                     actual, expected, strict=True):
                rows.append(comparison_row(op, dtype, want.shape, got, want, tolerance))
    return rows


BF16_UNIT_ROUNDOFF = 2.0**-8  # half an ulp of 1.0 in bfloat16 (8 significant bits)


def bf16_stepwise_rope_bound(max_abs_input: float) -> float:
    """How far a RoPE that rounds to bfloat16 at each step (as the NKI rope_hf kernel does: cos/sin loaded in
    q's dtype, then q*cos, rotate_half(q)*sin and their sum each rounded) may be from one that computes in
    float32 and rounds once (torchtitan's CosSinRoPE), for inputs up to `max_abs_input` = M. With u the unit
    roundoff: cos and sin rounded, 2uM over both products; each product rounded, uM each; the sum and the
    reference's own final rounding, u x sqrt(2)M each (|q cos + r sin| <= sqrt(2)M). In all
    (4 + 2 sqrt(2)) u M, about 0.027 M: a worst case, not an expected difference."""
    return (4 + 2 * math.sqrt(2)) * BF16_UNIT_ROUNDOFF * max_abs_input


def _rope_inputs(shape: dict[str, int], dtype, seed: int):
    import torch

    generator = _generator(seed)
    batch, seq, head_dim = shape["batch"], shape["seq"], shape["head_dim"]

    def sample(heads):
        return torch.randn(batch, seq, heads, head_dim, generator=generator).to(dtype)

    q, k = sample(shape["heads"]), sample(shape["kv_heads"])
    grad_q, grad_k = sample(shape["heads"]), sample(shape["kv_heads"])
    return q, k, grad_q, grad_k


def _rope_forward_backward(rope, q, k, grad_q, grad_k):
    import torch

    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    q_out, k_out = rope(q, k)
    torch.autograd.backward((q_out, k_out), (grad_q, grad_k))
    return q_out.detach(), k_out.detach(), q.grad, k.grad


def seq_len_rule_check(lnc: int, good_seq_len: int | None = None, bad_seq_len: int | None = None) -> dict[str, Any]:
    """Runs `HFLayoutRoPE` with the neuron rule on: a conforming seq len must pass, a bad one must raise."""
    from qwen3_pilot.config import NKI_ROPE_TILE
    from qwen3_pilot.titan.kernels.rope import SeqLenRuleError, required_seq_multiple

    multiple = required_seq_multiple(lnc)
    good = good_seq_len or multiple
    # At LNC > 1 the telling bad case is a multiple of 128 that is not one of 128 x LNC: a check of the
    # tile alone would let it through.
    bad = bad_seq_len or (multiple + NKI_ROPE_TILE if lnc > 1 else multiple + NKI_ROPE_TILE // 2)
    outcomes = {}
    for label, seq_len in (("good", good), ("bad", bad)):
        try:
            _rope_with_rule(seq_len, lnc)
            outcomes[label] = {"seq_len": seq_len, "raised": False, "error": None}
        except SeqLenRuleError as error:
            outcomes[label] = {"seq_len": seq_len, "raised": True, "error": str(error)}
    passed = not outcomes["good"]["raised"] and outcomes["bad"]["raised"]
    return {"lnc": lnc, "required_multiple": multiple, **outcomes, "verdict": "pass" if passed else "fail"}


def _rope_with_rule(seq_len: int, lnc: int) -> None:
    import torch

    from qwen3_pilot.titan.kernels.rope import HFLayoutRoPE

    head_dim = 8
    rope = HFLayoutRoPE(HFLayoutRoPE.Config(dim=head_dim, max_seq_len=seq_len, lnc=lnc))
    x = torch.zeros(1, seq_len, 1, head_dim)
    rope(x, x)


def seq_len_rule_problems(check: dict[str, Any]) -> list[str]:
    problems = []
    if check["good"]["raised"]:
        problems.append(f"seq_len_rule: seq_len={check['good']['seq_len']} conforms but raised: "
                        f"{check['good']['error']}")
    if not check["bad"]["raised"]:
        problems.append(
            f"seq_len_rule: seq_len={check['bad']['seq_len']} is not a multiple of {check['required_multiple']} "
            f"(128 x LNC={check['lnc']}) but did not raise"
        )
    return problems


# ---- MoE experts ----


def moe_numerics(
    shapes: list[dict[str, int]],
    dtypes: list[str],
    tolerances: dict[str, float],
    grouped_impl: Callable | None = None,
    include_torchtitan: bool = True,
    seed: int = 0,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """`grouped_impl` (default: the grouped matmul) against the per-expert loop in each dtype, forward
    output and gradients of x, w1, w2, w3; and, in bfloat16, torchtitan's own `GroupedExperts` too (it
    computes in bfloat16 whatever its inputs are, so a float32 row of it would measure rounding)."""
    from qwen3_pilot.titan.kernels.moe import grouped_experts_swiglu, looped_experts_swiglu, torchtitan_grouped_experts

    grouped_impl = grouped_impl or grouped_experts_swiglu
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            torch_dtype = _dtype(dtype)
            inputs = [t.to(device) for t in _moe_inputs(shape, torch_dtype, seed)]
            expected = _experts_forward_backward(looped_experts_swiglu, torch_dtype, *inputs)
            candidates = [(_impl_name(grouped_impl), grouped_impl)]
            if include_torchtitan and dtype == "bfloat16":
                candidates.append(("torchtitan.GroupedExperts", torchtitan_grouped_experts))
            for impl_name, impl in candidates:
                actual = _experts_forward_backward(impl, torch_dtype, *inputs)
                for op, got, want in zip(MOE_OPS, actual, expected, strict=True):
                    rows.append(comparison_row(op, dtype, want.shape, got, want, tolerances[dtype],
                                               impl=impl_name, reference="looped_experts_swiglu"))
    return rows


MOE_OPS = ("moe_forward", "moe_grad_x", "moe_grad_w1", "moe_grad_w2", "moe_grad_w3")


def _impl_name(impl: Callable) -> str:
    return getattr(impl, "__name__", type(impl).__name__)


def _moe_inputs(shape: dict[str, int], dtype, seed: int):
    """Expert-sorted tokens and per-expert counts; the last expert gets no token, so an empty group is
    always exercised. Weights scaled by fan-in so outputs and gradients stay near unit size in every
    shape, which keeps one absolute tolerance meaningful across shapes."""
    import torch

    generator = _generator(seed)
    tokens, dim, hidden, experts = shape["tokens"], shape["dim"], shape["hidden"], shape["experts"]
    expert_ids = torch.randint(0, max(experts - 1, 1), (tokens,), generator=generator)
    counts = torch.bincount(expert_ids, minlength=experts)
    x = torch.randn(tokens, dim, generator=generator).to(dtype)
    w1 = (torch.randn(experts, hidden, dim, generator=generator) * dim**-0.5).to(dtype)
    w2 = (torch.randn(experts, dim, hidden, generator=generator) * hidden**-0.5).to(dtype)
    w3 = (torch.randn(experts, hidden, dim, generator=generator) * dim**-0.5).to(dtype)
    grad_out = (torch.randn(tokens, dim, generator=generator) * tokens**-0.5).to(dtype)
    return x, counts, w1, w2, w3, grad_out


def _experts_forward_backward(impl: Callable, compute_dtype, x, counts, w1, w2, w3, grad_out):
    leaves = [t.clone().requires_grad_() for t in (x, w1, w2, w3)]
    x_, w1_, w2_, w3_ = leaves
    out = impl(x_, counts, w1_, w2_, w3_, compute_dtype=compute_dtype)
    out.backward(grad_out)
    return (out.detach(), *(leaf.grad for leaf in leaves))


# ---- tiny models, trained with and without the replacements ----


def tiny_titan_config(sizes: dict[str, int], seq_len: int, moe: bool):
    """torchtitan's own Qwen3 builders at toy sizes, with the recipes' decoder and SDPA attention (flex
    attention has no backward on CPU)."""
    from torchtitan.models.common import CosSinRoPE
    from torchtitan.models.qwen3 import _build_qwen3_layers, _build_qwen3_moe_layers

    from .titan.models import qwen3_decoder, use_sdpa

    dim, head_dim = sizes["dim"], sizes["head_dim"]
    common = dict(
        n_layers=sizes["layers"], dim=dim, n_heads=sizes["heads"], n_kv_heads=sizes["kv_heads"], head_dim=head_dim,
        attn_backend="flex", rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=seq_len, theta=1000000.0),
    )
    if moe:
        layers = _build_qwen3_moe_layers(
            **common, moe_hidden_dim=sizes["moe_hidden"], num_experts=sizes["experts"], top_k=sizes["top_k"],
            moe_comm_backend="standard",
        )
    else:
        layers = _build_qwen3_layers(**common, hidden_dim=sizes["hidden"])
    model = qwen3_decoder(dim=dim, vocab=sizes["vocab"], tied=False, layers=layers)
    use_sdpa(model)
    return model


def build_tiny_model(sizes: dict[str, int], seq_len: int, moe: bool, seed: int):
    import torch

    torch.manual_seed(seed)
    model = tiny_titan_config(sizes, seq_len, moe).build()
    model.init_states()
    return model


def kernel_rules(moe: bool) -> list[dict[str, str]]:
    """The rules the training stages configure: RoPE in every layer, and the experts of every MoE layer."""
    return [{"kernel": "rope_hf", "layers": "*"}] + ([{"kernel": "moe_grouped_experts", "layers": "*"}] if moe else [])


def replaced_model(
    sizes: dict[str, int], seq_len: int, moe: bool, reference, lnc: int | None,
    rope_apply: Callable | None = None, experts_impl: Callable | None = None,
):
    """The same tiny model built from its config after the kernel converters ran (as the trainer builds
    it), with `reference`'s weights; and {kernel: replaced module paths}. `rope_apply` / `experts_impl`
    swap the implementation under test (a test hands in a wrong one)."""
    from qwen3_pilot.titan.kernels.moe import KernelGroupedExperts
    from qwen3_pilot.titan.kernels.rope import HFLayoutRoPE
    from qwen3_pilot.titan.replacement import apply_converters, kernel_converters, replaced_paths

    config = apply_converters(tiny_titan_config(sizes, seq_len, moe), kernel_converters(kernel_rules(moe), lnc))
    model = config.build()
    model.init_states()
    model.load_state_dict(reference.state_dict())
    for module in model.modules():
        if rope_apply is not None and isinstance(module, HFLayoutRoPE):
            module.apply_rope = rope_apply
        if experts_impl is not None and isinstance(module, KernelGroupedExperts):
            module.experts_impl = experts_impl
    return model, replaced_paths(config)


def token_batches(steps: int, batch: int, seq_len: int, vocab: int, seed: int):
    """(inputs, labels) per step: random tokens, labels the inputs shifted by one."""
    import torch

    generator = _generator(seed + 1)
    tokens = torch.randint(0, vocab, (steps, batch, seq_len + 1), generator=generator)
    return [(step[:, :-1], step[:, 1:]) for step in tokens]


def train_losses(model, batches, lr: float) -> list[float]:
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for inputs, labels in batches:
        logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        loss = loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def replaced_model_trains(
    train: dict[str, Any], lnc: int | None, log: Callable[[str], None] | None = None, device: str = "cpu", **impls
) -> dict[str, Any]:
    """Per kind ("dense", "moe"): the same seed, weights and batches trained through torchtitan's modules
    and through the replacements; per-step losses of both and their largest difference. Also returns
    the replacement counts, and the built models for the compile check."""
    log = log or _log.info
    runs, counts, models = {}, {}, {}
    for kind in ("dense", "moe"):
        sizes = train[kind]
        reference = build_tiny_model(sizes, train["seq_len"], kind == "moe", train["seed"])
        replaced, paths = replaced_model(sizes, train["seq_len"], kind == "moe", reference, lnc, **impls)
        reference, replaced = reference.to(device), replaced.to(device)
        counts[kind] = {kernel: len(found) for kernel, found in paths.items()}
        models[kind] = copy.deepcopy(replaced)
        batches = [
            (inputs.to(device), labels.to(device))
            for inputs, labels in token_batches(
                train["steps"], train["batch"], train["seq_len"], sizes["vocab"], train["seed"]
            )
        ]
        started = time.perf_counter()
        reference_losses = train_losses(reference, batches, train["lr"])
        replaced_losses = train_losses(replaced, batches, train["lr"])
        runs[kind] = _loss_comparison(reference_losses, replaced_losses, train["tiny_model_loss_tolerance"])
        runs[kind]["seconds"] = round(time.perf_counter() - started, 2)
        log(f"{kind}: losses torchtitan {reference_losses} replaced {replaced_losses} "
            f"(max abs diff {runs[kind]['max_abs_loss_diff']:.3g})")
    return {"trains": runs, "replacement_counts": counts, "models": models}


def _loss_comparison(reference: list[float], replaced: list[float], tolerance: float) -> dict[str, Any]:
    diff = max(abs(a - b) for a, b in zip(reference, replaced, strict=True))
    finite = all(math.isfinite(x) for x in reference + replaced)
    return {
        "losses_reference": reference,
        "losses_replaced": replaced,
        "max_abs_loss_diff": diff,
        "tolerance": tolerance,
        "verdict": "pass" if finite and diff <= tolerance else "fail",
    }


def train_problems(trains: dict[str, Any]) -> list[str]:
    return [
        f"trains: {kind}: losses with replacements differ from torchtitan's by up to "
        f"{run['max_abs_loss_diff']:.3g} > tolerance {run['tolerance']:.3g} "
        f"({run['losses_reference']} vs {run['losses_replaced']})"
        for kind, run in trains.items()
        if run["verdict"] != "pass"
    ]


def count_problems(counts: dict[str, dict[str, int]], train: dict[str, Any]) -> list[str]:
    """apply_rules already refuses a wrong count; this guards the figures that reach the report."""
    problems = []
    for kind, per_rule in counts.items():
        layers = train[kind]["layers"]
        for rule, count in per_rule.items():
            if count != layers:
                problems.append(
                    f"replacement_counts: {kind}: rule {rule} replaced {count} modules, model has {layers} layers"
                )
    return problems


# ---- torch.compile ----


@contextlib.contextmanager
def inductor_cache(cache_dir: str | None) -> Iterator[str]:
    """Inductor's caches at `cache_dir` (or a temporary folder, removed afterwards) for the duration, so
    nothing lands in the system temp folder's torchinductor_<user>.

    Enter it before torchtitan is first imported: importing torch._dynamo (torchtitan does) creates the
    cache folder and writes its path into TORCHINDUCTOR_CACHE_DIR, the default one if the variable is
    unset then. The stage's environment should set the variable as well (backends.cache_env does)."""
    previous_env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with contextlib.ExitStack() as stack:
        path = str(cache_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="kernel_numerics_inductor_")))
        os.makedirs(path, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
        stack.enter_context(_precompiled_headers_under(path))
        try:
            yield path
        finally:
            if previous_env is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous_env


@contextlib.contextmanager
def _precompiled_headers_under(path: str) -> Iterator[None]:
    # Precompiled headers ignore TORCHINDUCTOR_CACHE_DIR: codecache fixes their folder under
    # tempfile.gettempdir() when it is imported, so it is pointed into the cache folder here.
    from torch._inductor import codecache

    previous = codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR
    codecache._HEADER_DIR = os.path.join(path, "precompiled_headers")
    codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
    try:
        yield
    finally:
        codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = previous


def compiled_matches_eager(model, inputs, backend: str, tolerance: float) -> dict[str, Any]:
    """Forward and backward of `model` eagerly and under torch.compile(backend): logits and parameter
    gradients compared."""
    import torch

    eager_logits, eager_grads = _logits_and_grads(copy.deepcopy(model), inputs)
    torch._dynamo.reset()
    compiled_model = copy.deepcopy(model)
    started = time.perf_counter()
    compiled_logits, compiled_grads = _logits_and_grads(torch.compile(compiled_model, backend=backend), inputs)
    seconds = time.perf_counter() - started
    logits_diff = max_abs_diff(compiled_logits, eager_logits)
    grad_diff = max(max_abs_diff(compiled_grads[name], grad) for name, grad in eager_grads.items())
    passed = logits_diff <= tolerance and grad_diff <= tolerance
    return {
        "backend": backend,
        "logits_max_abs_diff": logits_diff,
        "grad_max_abs_diff": grad_diff,
        "tolerance": tolerance,
        "seconds": round(seconds, 2),
        "verdict": "pass" if passed else "fail",
    }


def _logits_and_grads(model, inputs):
    logits = model(inputs)
    # A fixed, non-uniform upstream gradient: a plain .sum() would hand torch._grouped_mm's backward an
    # expanded zero-stride gradient, which it rejects on CPU.
    weights = (logits.detach().float() + 1.0).sin()
    (logits.float() * weights).mean().backward()
    grads = {name: p.grad.detach().clone() for name, p in _unwrapped(model).named_parameters() if p.grad is not None}
    return logits.detach(), grads


def _unwrapped(model):
    return getattr(model, "_orig_mod", model)


def compile_check(
    models: dict[str, Any], compile_config: dict[str, Any], inputs_for: Callable[[str], Any]
) -> dict[str, Any]:
    """The replaced models under torch.compile. backend "auto": inductor (needs a working C++ compiler),
    falling back to aot_eager when inductor fails to build, with the reason recorded. Run it inside
    `inductor_cache` (kernel_numerics does)."""
    backend = compile_config["backend"]
    results, fallback_reason = {}, None
    for kind in compile_config["models"]:
        model, inputs, tolerance = models[kind], inputs_for(kind), compile_config["tolerances"][kind]
        if backend != "auto":
            results[kind] = compiled_matches_eager(model, inputs, backend, tolerance)
            continue
        if fallback_reason is None:
            try:
                results[kind] = compiled_matches_eager(model, inputs, "inductor", tolerance)
                continue
            except Exception as error:  # a missing or broken C++ toolchain shows up as many error types
                fallback_reason = f"inductor failed: {type(error).__name__}: {str(error)[:300]}"
        results[kind] = compiled_matches_eager(model, inputs, "aot_eager", tolerance)
    backends = sorted({result["backend"] for result in results.values()})
    return {
        "requested_backend": backend,
        "backend": backends[0] if len(backends) == 1 else backends,
        "fallback_reason": fallback_reason,
        "cache_dir": compile_config.get("cache_dir") or "(temporary, removed)",
        "models": results,
    }


def compile_problems(compile_result: dict[str, Any]) -> list[str]:
    return [
        f"compile: {kind} ({result['backend']}): compiled vs eager logits differ by "
        f"{result['logits_max_abs_diff']:.3g}, gradients by {result['grad_max_abs_diff']:.3g} "
        f"(tolerance {result['tolerance']:.3g})"
        for kind, result in compile_result["models"].items()
        if result["verdict"] != "pass"
    ]


# ---- the stage ----


def kernel_numerics(config: dict[str, Any], log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Everything the stage measures; "problems" lists each failed check in words (empty: all passed)."""
    # Before anything imports torchtitan (and with it torch._dynamo, which fixes the cache folder).
    with inductor_cache(config["compile"].get("cache_dir")):
        return _kernel_numerics(config, log or _log.info)


def _kernel_numerics(config: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    lnc, train, device = config["lnc"], config["train"], config["device"]
    rope_cfg, moe_cfg = config["rope"], config["moe"]

    rope_rows = rope_numerics(
        rope_cfg["shapes"], rope_cfg["dtypes"], rope_cfg["tolerances"], theta=rope_cfg["theta"], device=device
    )
    log(f"rope: {len(rope_rows)} rows, largest diff per dtype {_largest_per_dtype(rope_rows)}")
    moe_rows = moe_numerics(moe_cfg["shapes"], moe_cfg["dtypes"], moe_cfg["tolerances"], device=device)
    log(f"moe: {len(moe_rows)} rows, largest diff per dtype {_largest_per_dtype(moe_rows)}")
    rule = seq_len_rule_check(lnc)
    log(f"seq_len rule at LNC={lnc}: {rule['verdict']} ({rule['bad']['error']})")
    trained = replaced_model_trains(train, lnc, log=log, device=device)

    batches = {
        kind: token_batches(
            1, train["batch"], train["seq_len"], train[kind]["vocab"], train["seed"] + 100
        )[0][0].to(device)
        for kind in ("dense", "moe")
    }
    compiled = compile_check(trained["models"], config["compile"], batches.__getitem__)
    for kind, result in compiled["models"].items():
        log(f"compile {kind} ({result['backend']}, {result['seconds']} s): "
            f"logits diff {result['logits_max_abs_diff']:.3g}, grad diff {result['grad_max_abs_diff']:.3g}")

    problems = (
        row_problems("rope", rope_rows)
        + row_problems("moe", moe_rows)
        + seq_len_rule_problems(rule)
        + count_problems(trained["replacement_counts"], train)
        + train_problems(trained["trains"])
        + compile_problems(compiled)
    )
    from .titan.kernels import KERNELS, implementation

    return {
        "device": device,
        "implementations": {kernel: implementation(kernel) for kernel in KERNELS},
        "rope": rope_rows,
        "moe": moe_rows,
        "seq_len_rule": rule,
        "replacement_counts": trained["replacement_counts"],
        "trains": trained["trains"],
        "compile": compiled,
        "problems": problems,
    }


def _largest_per_dtype(rows: list[dict[str, Any]]) -> dict[str, float]:
    largest: dict[str, float] = {}
    for row in rows:
        largest[row["dtype"]] = max(largest.get(row["dtype"], 0.0), row["max_abs_diff"])
    return largest


class NumericsError(RuntimeError):
    pass


