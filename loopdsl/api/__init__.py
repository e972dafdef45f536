"""The Python API the CLI calls: run, resume, decide, abort."""
