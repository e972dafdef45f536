"""The errors of templates, expressions and shell commands: a TemplateError when one cannot be
compiled, a RenderError when rendering fails. They live at the bottom so that every template
module can raise them without importing another; templates.py and sandbox.py re-export them."""
from __future__ import annotations

# Rule ids carried by TemplateError (lint reports them as `[rule-id]`); the shell ones are in
# shell_template.py.
RULE_SYNTAX = "template-syntax"


class TemplateError(Exception):
    """A template, expression or shell command that cannot be compiled."""

    def __init__(self, message: str, rule: str = RULE_SYNTAX, offset: int | None = None,
                 hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.rule = rule
        self.offset = offset
        self.hint = hint


class RenderError(Exception):
    """Rendering or evaluating failed at run time (undefined name, sandbox, type, size)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
