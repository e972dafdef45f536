"""Lint: the pipeline, the rule registry and rules/<topic>.py, the lock file. Imports only `language`; never LiteLLM."""
