"""The torchtitan side of the pilot: what the ranks build and run. `in_ranks/` holds the entry points torchrun
starts (the rank check's worker, the trainer's entry, the recipes as torchtitan config functions, the metrics
hooks); beside them the models the recipes build, the kernel replacements (torchtitan config converters) and the
kernels, the parity check of a built model against the checkpoint's config.json, the torchtitan API check, and
the adapter per torchtitan API level (api_levels.py, with attention.py's SDPA for the level that folds the batch).
The stage processes import the same modules to build and check the same models outside the ranks (the fixture,
the numerics, the export, the preflight)."""
