"""Templates and expressions (sandboxed Jinja2, strict undefined): the public API.

The sandbox and its limits are in sandbox.py, injection-proof shell commands in
shell_template.py; the names other modules import from here are re-exported below, so
`from loopdsl.language.templates import ...` keeps working for all of them.
"""
from __future__ import annotations

import functools
import json
from collections import ChainMap
from collections.abc import Iterator, Mapping
from typing import Any

from jinja2 import nodes
from jinja2 import meta as jinja_meta
from jinja2.environment import Template as JinjaTemplate
from jinja2.exceptions import TemplateSyntaxError
from jinja2.parser import Parser

from .jinja_depth import check_nesting, check_tree_depth
from .model import DEFAULT_OUTPUT_CAP
from .sandbox import (
    MAX_INT_BITS,
    MAX_SEQUENCE,
    MAX_STEPS,
    MAX_WORK,
    RULE_SYNTAX,
    RenderError,
    TemplateError,
    _BoundLoops,
    _environment,
    _guarded,
    _reject_undefined,
)
from .shell_command import (
    ENV_CHUNK_BYTES,
    MAX_ENV_STRING,
    NO_FACTS,
    RULE_ARITHMETIC,
    RULE_BACKTICK,
    RULE_CODE,
    RULE_COMMAND,
    RULE_ESCAPED,
    RULE_HEREDOC,
    RULE_NAME,
    RULE_OPTION,
    RULE_PLACE,
    RULE_SHELL_SYNTAX,
    RULE_SINGLE_QUOTE,
    RULE_STATEMENT,
    RULE_UNSAFE_RAW,
    InputFacts,
    ShellCommand,
    analyze_shell,
    argv_problems,
    check_argv,
    check_env,
    check_shell,
    compile_shell,
    env_problems,
    shell_problems,
)

__all__ = [
    "ENV_CHUNK_BYTES", "GLOBALS_INSTALLED", "MAX_ENV_STRING", "MAX_INT_BITS", "MAX_SEQUENCE",
    "MAX_STEPS", "MAX_WORK", "RULE_ARITHMETIC", "RULE_BACKTICK", "RULE_CODE", "RULE_COMMAND",
    "RULE_ESCAPED", "RULE_HEREDOC", "RULE_NAME", "RULE_OPTION", "RULE_PLACE", "RULE_SHELL_SYNTAX",
    "RULE_SINGLE_QUOTE", "RULE_STATEMENT", "RULE_SYNTAX", "RULE_UNSAFE_RAW", "TRUNCATION_MARKER",
    "Expression", "InputFacts", "NO_FACTS", "RenderError", "ShellCommand", "Template", "TemplateError", "analyze_shell",
    "argv_problems", "check_argv", "check_env", "check_expression", "check_shell", "check_template",
    "env_problems", "shell_problems",
    "compile_expression", "compile_shell", "compile_template", "install_globals", "to_text",
    "truncate_text", "variables",
]


# ---------------------------------------------------------------- errors

def _line_offset(source: str, lineno: int | None) -> int | None:
    if not lineno:
        return None
    offset = 0
    for _ in range(lineno - 1):
        nl = source.find("\n", offset)
        if nl < 0:
            return offset
        offset = nl + 1
    return offset


def _syntax_error(exc: TemplateSyntaxError, source: str, base: int = 0) -> TemplateError:
    offset = _line_offset(source, exc.lineno)
    return TemplateError(f"template syntax error: {exc.message}", RULE_SYNTAX,
                         None if offset is None else base + offset)


# ---------------------------------------------------------------- text

TRUNCATION_MARKER = "\n[... truncated by loopdsl at {cap} bytes]"


def truncate_text(text: str, cap: int = DEFAULT_OUTPUT_CAP) -> str:
    """Cut `text` to at most `cap` UTF-8 bytes (never inside a character) and mark the cut."""
    if len(text) * 4 <= cap:
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap:
        return text
    kept = data[:cap].decode("utf-8", "ignore")
    return kept + TRUNCATION_MARKER.format(cap=cap)


def to_text(value: Any) -> str:
    """How a value becomes text in a command or environment variable."""
    if isinstance(value, str):
        return str(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return list(value)
    return str(value)


# ---------------------------------------------------------------- expressions and templates

def _parse_expression(source: str) -> nodes.Expr:
    env = _environment()
    try:
        check_nesting(env, source, expression=True)
        parser = Parser(env, source, state="variable")
        expr = parser.parse_expression()
        if not parser.stream.eos:
            raise TemplateSyntaxError(f"unexpected {parser.stream.current.value!r} after the "
                                      "expression", parser.stream.current.lineno)
        check_tree_depth(expr, len(source))
    except TemplateSyntaxError as exc:
        raise _syntax_error(exc, source) from None
    return expr


def _parse_template(source: str) -> nodes.Template:
    env = _environment()
    try:
        check_nesting(env, source)
        tree = env.parse(source)
        check_tree_depth(tree, len(source))
    except TemplateSyntaxError as exc:
        raise _syntax_error(exc, source) from None
    return tree


def _compile_tree(tree: nodes.Template, source: str) -> JinjaTemplate:
    env = _environment()
    tree = _BoundLoops().visit(tree)
    tree.set_environment(env)
    try:
        return env.from_string(tree)
    except TemplateSyntaxError as exc:   # e.g. an unknown filter name
        raise _syntax_error(exc, source) from None


def _check_tree(tree: nodes.Template, source: str, *, expression: bool = False) -> None:
    """What _compile_tree would raise, without building the Python code object: Jinja's
    code generator finds every remaining problem (unknown filters and tests ...), and
    lint, which never renders, spares the bytecode compile (a third of the cost)."""
    env = _environment()
    if (expression or not _has_generator_checked_statements(tree)) and _known_filters_and_tests(tree, env):
        return
    tree = _BoundLoops().visit(tree)
    tree.set_environment(env)
    try:
        env.compile(tree, raw=True)
    except TemplateSyntaxError as exc:
        raise _syntax_error(exc, source) from None


# The statements whose misuse only Jinja's code generator reports (a loop variable named
# `loop`, a `caller` argument, a block defined twice, a misplaced `extends`).
_GENERATOR_CHECKED = (nodes.For, nodes.Macro, nodes.CallBlock, nodes.Block, nodes.Extends)


def _has_generator_checked_statements(tree: nodes.Template) -> bool:
    return any(True for _ in tree.find_all(_GENERATOR_CHECKED))


def _known_filters_and_tests(tree: nodes.Template, env: Any) -> bool:
    """Whether every filter and test the tree names exists. Without the statements of
    `_GENERATOR_CHECKED` that is the only thing Jinja's code generator can reject
    (jinja2/compiler.py, 3.1), so lint need not generate the code; any other tree is
    generated, which gives Jinja's own message."""
    return (all(node.name in env.filters for node in tree.find_all(nodes.Filter))
            and all(node.name in env.tests for node in tree.find_all(nodes.Test)))


def _expression_tree(expr: nodes.Expr) -> nodes.Template:
    """An expression as a template that stores its value in `result`."""
    return nodes.Template([nodes.Assign(nodes.Name("result", "store", lineno=1), expr, lineno=1)], lineno=1)


# A key no template can name (Jinja names cannot hold NUL): marks a context dict that
# already carries the environment's globals, so expressions need not layer them on.
GLOBALS_INSTALLED = "\x00globals"


def install_globals(context: dict[str, Any]) -> None:
    """Put the sandbox's globals (range, dict, namespace ...) into a long-lived context
    dict once, so each expression evaluated on it skips a per-call layering."""
    for name, value in _environment().globals.items():
        context.setdefault(name, value)
    context[GLOBALS_INSTALLED] = True


# The Jinja code of an expression, cached by source as compile_template is: parsing and
# compiling is most of a loop's compile time, repeated in every run of a long-lived process.
# Only the code is shared; each Expression keeps its own evaluation context.
@functools.lru_cache(maxsize=2048)
def _compiled_expression(source: str) -> JinjaTemplate:
    return _compile_tree(_expression_tree(_parse_expression(source)), source)


class Expression:
    """A compiled Jinja expression (`when`, `expr`, `set` values, `for_each`)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._template = _compiled_expression(source)
        self._cached: Any = None

    def __call__(self, context: Mapping[str, Any]) -> Any:
        def run() -> Any:
            ctx = self._context_for(context)
            for _ in self._template.root_render_func(ctx):
                pass
            result = ctx.vars.pop("result")
            if isinstance(result, Iterator):   # a lazy map/select: evaluate it inside the guard
                result = list(result)
            return _reject_undefined(result)
        return _guarded(run)

    def _context_for(self, context: Mapping[str, Any]) -> Any:
        """A Jinja context over `context` without copying it (shared=True).

        An engine evaluates its expressions over one long-lived dict that already holds
        the globals (install_globals): the Jinja context built over that dict is kept and
        reused while the dict is the same object, since an expression only ever writes its
        own `result`, which is taken out after each call. Other mappings get a fresh
        context with the globals layered beneath."""
        if context.get(GLOBALS_INSTALLED) is not True:
            scope = ChainMap(context, self._template.globals)  # type: ignore[arg-type]
            return self._template.new_context(scope, shared=True)  # type: ignore[arg-type]
        cached = self._cached
        if cached is not None and cached.parent is context:
            return cached
        self._cached = self._template.new_context(context, shared=True)  # type: ignore[arg-type]
        return self._cached

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"


class Template:
    """A compiled Jinja template (prompts, outputs, messages, cwd, argv elements)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._template = _compile_tree(_parse_template(source), source)

    def render(self, context: Mapping[str, Any], cap: int = DEFAULT_OUTPUT_CAP) -> str:
        def run() -> str:
            pieces: list[str] = []
            size = 0
            # Streamed so that a template producing gigabytes stops at the cap.
            for piece in self._template.generate(dict(context)):
                pieces.append(piece)
                size += len(piece.encode("utf-8", "surrogatepass"))
                if size > cap:
                    break
            return truncate_text("".join(pieces), cap)
        return _guarded(run)

    def __repr__(self) -> str:
        return f"Template({self.source!r})"


def compile_expression(source: str) -> Expression:
    # A new Expression each time (its code is cached): an Expression keeps the Jinja context of
    # the mapping it last evaluated over, which a process-wide cache would keep alive.
    return Expression(source)


# Cached by source: a long-lived process (the API, `ui`, a fan-out of runs, a test suite)
# compiles the same loop's templates again and again, and Jinja's parse and compile is most of
# that. The Jinja environment is one per process and a Template keeps no state between renders.
@functools.lru_cache(maxsize=2048)
def compile_template(source: str) -> Template:
    return Template(source)


def check_expression(source: str, parsed: nodes.Expr | None = None) -> None:
    """Raise the TemplateError compile_expression would, without compiling (for lint)."""
    _check_tree(_expression_tree(parsed if parsed is not None else _parse_expression(source)), source,
                expression=True)


def check_template(source: str) -> None:
    """Raise the TemplateError compile_template would, without compiling (for lint)."""
    _check_tree(_parse_template(source), source)


def variables(source: str, *, expression: bool = False) -> set[str]:
    """Root names that a template (or an expression) reads from its context."""
    if expression:
        tree = nodes.Template([nodes.Output([_parse_expression(source)], lineno=1)], lineno=1)
    else:
        tree = _parse_template(source)
    tree.set_environment(_environment())
    return set(jinja_meta.find_undeclared_variables(tree))
