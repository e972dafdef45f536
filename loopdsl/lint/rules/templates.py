"""Lint rules for templates and expressions: syntax, shell quoting, the names they read.

Every string the engine renders or evaluates is a *site* (lint/template_sites.py). The
rules check each site's syntax and shell quoting (here), that every name it reads exists
and has surely been set on every path that reaches it, and that secrets do not leak into
commands or prompts (template_names.py).
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from ...language.diagnostics import Diagnostic, Severity
from ...language.model import YamlPath
from ...language.template_scan import ScanError, scan
from ..registry import LintContext, rule
from ..template_sites import TEMPLATE_ROOTS, Mode, Phase, Site, Where, raw_at, sites
from .template_names import available_states, secret_diagnostic, use_diagnostic, whole_secret_counts

__all__ = ["TEMPLATE_ROOTS", "Mode", "Phase", "Site", "Where", "names_read", "sites", "template_rules"]


# ---------------------------------------------------------------- syntax


Problem = tuple[str, str, int, str, Severity]  # message, rule id, offset in the source, hint


@lru_cache(maxsize=4096)
def _compile_problems(source: str, mode: Mode, facts: Any = None) -> tuple[Problem, ...]:
    """Syntax and quoting problems of one site, as templates.py (the engine's own
    compiler) sees them. Cached: loops repeat the same commands and guards."""
    from ...language import templates

    warnings: list[templates.TemplateError] = []
    try:
        if mode == "shell":
            errors, warnings = templates.shell_problems(source, facts or templates.NO_FACTS)
        else:
            (templates.check_expression if mode == "expr" else templates.check_template)(source)
            errors = []
    except templates.TemplateError as exc:
        errors = [exc]
    return tuple((e.message, e.rule, int(e.offset or 0), e.hint, severity)
                 for group, severity in ((errors, Severity.ERROR), (warnings, Severity.WARNING))
                 for e in group)


_SYNTAX_HINTS = {
    "template-syntax": "fix the Jinja syntax: `{{ name }}` for values, `{% if %}...{% endif %}` for logic",
    "expr-syntax": "a guard or expression is a Jinja expression without braces, e.g. `review.verdict == 'accept'`",
    "shell-quote-single": "a value inside single quotes is never substituted; leave `{{ }}` unquoted or in "
    "double quotes (loopdsl quotes it for you)",
    "shell-quote-heredoc": "a heredoc body is not substituted safely; pass the value as an argument or via "
    "`env:` and read it as \"$NAME\"",
    "shell-quote-backtick": "use `$( ... )` instead of backticks, with the placeholder outside any quotes",
    "shell-statement": "commands allow only `{{ value }}` placeholders; compute values in a `set` state first",
    "shell-syntax": "fix the shell syntax; loopdsl reads each command with a bash parser to find where values stand",
    "shell-unsafe-raw": "drop `unsafe_raw` so the value is passed as one quoted argument; if you need shell "
    "syntax from a value, write it in the command itself",
}


def _input_facts(ctx: LintContext) -> Any:
    from ...language.compile import input_facts

    return input_facts(ctx.loop)


def _syntax_diagnostics(ctx: LintContext, site: Site) -> list[Diagnostic]:
    out = []
    facts = _input_facts(ctx).with_env(dict(site.env)) if site.mode == "shell" else None
    for message, rule_id, offset, hint, severity in _compile_problems(site.source, site.mode, facts):
        if site.mode == "expr" and rule_id == "template-syntax":
            rule_id = "expr-syntax"
            message = message.replace("template syntax error", "expression syntax error")
        if hint and message.endswith(hint):  # templates.py repeats its hint in the message
            message = message[: -len(hint)].rstrip(" ;:,")
        out.append(ctx.diag(
            rule_id,
            message,
            position=ctx.at_offset(site.path, site.source, offset),
            hint=hint or _SYNTAX_HINTS.get(rule_id, ""),
            severity=severity,
        ))
    return out


def _env_diagnostics(ctx: LintContext, all_sites: list[Site]) -> Iterator[Diagnostic]:
    """`env: {PS4: "{{ v }}"}`: a value in a variable that decides what runs."""
    from ...language import templates

    for site in all_sites:
        if len(site.path) < 2 or site.path[-2] != "env" or len(site.env) != 1:
            continue
        for _key, problem in templates.env_problems(dict(site.env)):
            message = problem.message
            if problem.hint and message.endswith(problem.hint):
                message = message[: -len(problem.hint)].rstrip(" ;:,")
            yield ctx.diag(problem.rule, message, hint=problem.hint,
                           position=ctx.at_offset(site.path, site.source, int(problem.offset or 0)))


def _argv_diagnostics(ctx: LintContext, all_sites: list[Site]) -> Iterator[Diagnostic]:
    """`argv:` lists whose program runs an element as code (`[sh, -c, "... {{ v }}"]`)."""
    from ...language import templates

    seen: set[YamlPath] = set()
    for site in all_sites:
        if len(site.path) < 2 or site.path[-2] != "argv" or site.path[:-1] in seen:
            continue
        seen.add(site.path[:-1])
        argv = raw_at(ctx, site.path[:-1])
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            continue
        errors, warnings = templates.argv_problems(tuple(argv))
        for group, severity in ((errors, Severity.ERROR), (warnings, Severity.WARNING)):
            for index, problem in group:
                message = problem.message
                if problem.hint and message.endswith(problem.hint):
                    message = message[: -len(problem.hint)].rstrip(" ;:,")
                path = site.path[:-1] + (index,)
                yield ctx.diag(problem.rule, message, severity=severity, hint=problem.hint,
                               position=ctx.at_offset(path, argv[index], int(problem.offset or 0)))


@rule
def template_rules(ctx: LintContext) -> Iterator[Diagnostic]:
    all_sites = ctx.template_sites
    yield from _argv_diagnostics(ctx, all_sites)
    yield from _env_diagnostics(ctx, all_sites)
    for site in all_sites:
        syntax = _syntax_diagnostics(ctx, site)
        yield from syntax
        if any(d.rule in ("template-syntax", "expr-syntax") for d in syntax):
            continue  # names in a template that does not parse mean little
        try:
            scanned = scan(site.source, site.mode == "expr")
        except ScanError:
            continue
        available = available_states(ctx, site)
        whole = whole_secret_counts(site)
        reads = [use.attr for use in scanned.uses if use.root == "secrets"]
        seen: set[tuple[str, str | None]] = set()
        for use in scanned.uses:
            key = (use.root, use.attr)
            if key in seen:
                continue
            seen.add(key)
            every_read_whole = use.attr is not None and whole.get(use.attr, 0) >= reads.count(use.attr)
            for found in (use_diagnostic(ctx, site, use, available),
                          secret_diagnostic(ctx, site, use, every_read_whole)):
                if found is not None:
                    yield found


def names_read(source: str, expression: bool = False) -> set[str]:
    """Root names a template reads ({} when it does not parse)."""
    try:
        return {use.root for use in scan(source, expression).uses}
    except ScanError:
        return set()
