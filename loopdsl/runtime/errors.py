"""Errors the runtime reacts to: a step's failure kinds, the run store's and the reply script's user errors."""
from __future__ import annotations

from ..language.errors import LoopdslError



class StepFailure(Exception):
    """An attempt failed with one of the DSL's error kinds."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None, result: dict | None = None,
                 fatal: bool = False):
        super().__init__(message)
        # The run ends `failed`: neither retried nor routed by `on_failure` (a broken safety rule).
        self.fatal = fatal
        self.kind = kind
        self.message = message
        self.retry_after = retry_after
        self.result = result
        # Attempts already made in place before this failure (an agent's turn retried on the
        # same turn): they count against the state's `retry.max_attempts` too.
        self.in_place = 0


class StoreError(LoopdslError):
    """A problem with the run store a user can act on: says what happened and how to fix it."""

    def __init__(self, message: str, hint: str = "", exit_code: int | None = None) -> None:
        super().__init__(message, hint, exit_code)
        self.args = (f"{message}\n  hint: {hint}" if hint else message,)  # str() carries the hint too


class _ReplyScriptMistake(LoopdslError):
    """A reply-script problem: str() is the bare problem, `message` says it is the script's."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"reply script: {problem}", "see docs/cli.md, 'Scripted replies'")
        self.args = (problem,)


class ScriptExhausted(_ReplyScriptMistake):
    """The script has no reply left for a state that asked for one."""


class ScriptError(_ReplyScriptMistake, ValueError):
    """The script file itself is wrong (where, what, how to fix)."""
