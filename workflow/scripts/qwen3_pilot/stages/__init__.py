"""One module per stage of the pilot, each with the `run(...)` its thin script (workflow/scripts/<stage>.py)
calls inside the stage log. They run in the stage process that Snakemake starts: they read the inputs,
launch or compute, and write the stage's summary; the logic they call lives in the package's library
modules, with unit tests. Code that runs inside torchrun's ranks is in qwen3_pilot.in_ranks."""
