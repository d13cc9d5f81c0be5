"""The replaced tiny models under torch.compile against eager, with inductor's caches kept under the project."""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from .comparison import max_abs_diff


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


def compiled_against_eager(model, inputs, backend: str) -> dict[str, Any]:
    """Forward and backward of `model` eagerly and under torch.compile(backend): the largest differences of the
    logits and of the parameter gradients."""
    import torch

    eager_logits, eager_grads = _logits_and_grads(copy.deepcopy(model), inputs)
    torch._dynamo.reset()
    compiled_model = copy.deepcopy(model)
    started = time.perf_counter()
    compiled_logits, compiled_grads = _logits_and_grads(torch.compile(compiled_model, backend=backend), inputs)
    seconds = time.perf_counter() - started
    return {
        "backend": backend,
        "logits_max_abs_diff": max_abs_diff(compiled_logits, eager_logits),
        "grad_max_abs_diff": max(max_abs_diff(compiled_grads[name], grad) for name, grad in eager_grads.items()),
        "seconds": round(seconds, 2),
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
    `inductor_cache` (the stage does)."""
    backend = compile_config["backend"]
    results, fallback_reason = {}, None
    for kind in compile_config["models"]:
        model, inputs = models[kind], inputs_for(kind)
        if backend != "auto":
            results[kind] = compiled_against_eager(model, inputs, backend)
            continue
        if fallback_reason is None:
            try:
                results[kind] = compiled_against_eager(model, inputs, "inductor")
                continue
            except Exception as error:  # a missing or broken C++ toolchain shows up as many error types
                fallback_reason = f"inductor failed: {type(error).__name__}: {str(error)[:300]}"
        results[kind] = compiled_against_eager(model, inputs, "aot_eager")
    backends = sorted({result["backend"] for result in results.values()})
    return {
        "requested_backend": backend,
        "backend": backends[0] if len(backends) == 1 else backends,
        "fallback_reason": fallback_reason,
        "cache_dir": compile_config.get("cache_dir") or "(temporary, removed)",
        "models": results,
    }
