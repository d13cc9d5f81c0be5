"""Code that runs inside torchrun's processes, one copy per rank: the rank check's worker, the trainer's
entry point, the recipes (torchtitan config functions) and the metrics hooks. They import torch and
torchtitan freely; the stage processes that launch them (qwen3_pilot.launch) do not import them."""
