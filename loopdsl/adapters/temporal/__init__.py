"""Runs loops as Temporal workflows: the same engine, hosted through its ports.

Optional (`pip install loopdsl[temporal]`): every module here but `loops` imports
`temporalio`, so only the CLI's worker and `--temporal` commands import this package,
at function level. See docs/scale-out.md.
"""
