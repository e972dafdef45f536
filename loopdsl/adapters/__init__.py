"""Implementations of the runtime's ports, one outside dependency each (LiteLLM, the terminal, git, the run store)."""
