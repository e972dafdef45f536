"""Errors the runtime reacts to: a step's failure kinds, the run store's and the reply script's user errors."""
from __future__ import annotations



class StepFailure(Exception):
    """An attempt failed with one of the DSL's error kinds."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None, result: dict | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after
        self.result = result


class StoreError(Exception):
    """A problem with the run store a user can act on: says what happened and how to fix it."""

    def __init__(self, message: str, hint: str = "") -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message}\n  hint: {hint}" if hint else message)


class ScriptExhausted(Exception):
    """The script has no reply left for a state that asked for one."""


class ScriptError(ValueError):
    """The script file itself is wrong (where, what, how to fix)."""
