"""The Qwen3 Trainium pilot: stage logic behind the Snakemake rules.

Modules here must stay cheap to import (no torch at import time): the Snakefile imports
`config` and `pins` while it parses.
"""
