"""Lint rules for templates and expressions: syntax, shell quoting, the names they read.

Every string the engine renders or evaluates is a *site*: where it is (YAML path),
how it is read (template, expression, shell command), and when it runs relative to
its state (before the action, after it, or at an end). The rules check each site's
syntax, that every name it reads exists and has surely been set on every path that
reaches it, and that secrets do not leak into commands or prompts.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from ...language.diagnostics import Diagnostic, Severity
from ...language.dominators import DominatorTree
from ...language.model import RESERVED_NAMES, WHOLE_SECRET_RE, Gate, ShellSpec, State, YamlPath
from ..registry import LintContext, did_you_mean, quoted_list, rule
from ...language.template_scan import NameUse, ScanError, scan, use_offset

Mode = Literal["template", "expr", "shell"]
# pre: before the state's action (its own result is not there on the first visit);
# post: after it (after-gates, transition guards); outputs: top-level outputs;
# definition: a named gate, whose context is the state that refers to it.
Phase = Literal["pre", "post", "outputs", "definition"]
# env: a command's `env:` value; with: a sub-loop's `with:` value (secret rules differ there).
Where = Literal["prompt", "command", "env", "with", "other"]

TEMPLATE_ROOTS = frozenset(RESERVED_NAMES)


@dataclass(frozen=True)
class Site:
    path: YamlPath
    source: str
    mode: Mode
    where: Where
    phase: Phase
    state: str | None
    # For a shell command: its `env:` (values that are templates carry values into bash).
    env: tuple[tuple[str, str], ...] = ()


def _raw(ctx: LintContext, path: YamlPath) -> Any:
    node: Any = ctx.doc.data
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _shell_sites(ctx: LintContext, spec: ShellSpec, phase: Phase, state: str | None) -> Iterator[Site]:
    path = spec.path
    env = tuple(sorted((k, str(v)) for k, v in spec.env.items()))
    if isinstance(_raw(ctx, path), str):
        if spec.cmd is not None:
            yield Site(path, spec.cmd, "shell", "command", phase, state, env)
        return
    if spec.cmd is not None:
        yield Site(path + ("cmd",), spec.cmd, "shell", "command", phase, state, env)
    for i, arg in enumerate(spec.argv or ()):
        yield Site(path + ("argv", i), arg, "template", "command", phase, state)
    if spec.cwd is not None:
        yield Site(path + ("cwd",), str(spec.cwd), "template", "command", phase, state)
    # env values reach the process as environment variables, the safe way to pass a secret.
    for key, value in spec.env.items():
        yield Site(path + ("env", key), value, "template", "env", phase, state, ((key, value),))


def _gate_sites(ctx: LintContext, gate: Gate, phase: Phase, state: str | None) -> Iterator[Site]:
    if gate.kind == "shell" and gate.shell is not None:
        yield from _shell_sites(ctx, gate.shell, phase, state)
    elif gate.kind == "expr" and gate.expr is not None:
        yield Site(gate.path + ("expr",), gate.expr, "expr", "other", phase, state)
    elif gate.kind == "builtin" and isinstance(gate.value, str):
        yield Site(gate.path + ("value",), gate.value, "template", "other", phase, state)


def _state_sites(ctx: LintContext, state: State) -> Iterator[Site]:
    p, name, a = state.path, state.name, state.action
    if state.kind == "shell" and isinstance(a, ShellSpec):
        yield from _shell_sites(ctx, a, "pre", name)
    elif state.kind in ("llm", "evaluate"):
        body = _raw(ctx, p + (state.kind,)) or {}
        for key in ("prompt", "system"):
            if isinstance(body.get(key), str):
                yield Site(p + (state.kind, key), body[key], "template", "prompt", "pre", name)
        criteria = body.get("criteria")
        for i, item in enumerate(criteria if isinstance(criteria, list) else ()):
            if isinstance(item, str):
                yield Site(p + (state.kind, "criteria", i), item, "template", "prompt", "pre", name)
    elif state.kind == "checkpoint":
        body = _raw(ctx, p + ("checkpoint",))
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            yield Site(p + ("checkpoint", "message"), body["message"], "template", "other", "pre", name)
    elif state.kind == "set":
        body = _raw(ctx, p + ("set",))
        for key, value in (body.items() if isinstance(body, dict) else ()):
            if isinstance(value, str):
                yield Site(p + ("set", key), value, "expr", "other", "pre", name)
    elif state.kind == "loop":
        raw_state = _raw(ctx, p) or {}
        if isinstance(raw_state.get("for_each"), str):
            yield Site(p + ("for_each",), raw_state["for_each"], "expr", "other", "pre", name)
        with_ = raw_state.get("with")
        for key, value in (with_.items() if isinstance(with_, dict) else ()):
            if isinstance(value, str):
                yield Site(p + ("with", key), value, "template", "with", "pre", name)
    for key, value in state.output.items():
        if isinstance(value, str):
            yield Site(p + ("output", key), value, "template", "other", "pre", name)
    for gate in state.gates_before:
        yield from _gate_sites(ctx, gate, "pre", name)
    for gate in state.gates_after:
        yield from _gate_sites(ctx, gate, "post", name)
    for t in state.transitions:
        if isinstance(t.when, str):
            yield Site(t.path + ("when",), t.when, "expr", "other", "post", name)


def sites(ctx: LintContext) -> list[Site]:
    out: list[Site] = []
    for state in ctx.states.values():
        out.extend(_state_sites(ctx, state))
    for name in ctx.local_gates:
        gate = ctx.loop.gates.get(name)
        if gate is not None:
            out.extend(_gate_sites(ctx, gate, "definition", None))
    for key, value in ctx.loop.outputs.items():
        if isinstance(value, str):
            out.append(Site(("outputs", key), value, "template", "other", "outputs", None))
    return out


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
        argv = _raw(ctx, site.path[:-1])
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


# ---------------------------------------------------------------- names


@dataclass(frozen=True)
class _Dominating:
    """The states that dominate `target`, less `excluded`: results surely set there."""

    tree: DominatorTree
    target: str
    excluded: frozenset[str]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name not in self.excluded and self.tree.dominates(name, self.target)


def _available(ctx: LintContext, site: Site) -> _Dominating | None:
    """States whose results are surely set when `site` is evaluated; None: do not check."""
    if site.phase == "definition":
        return None
    tree = ctx.dominators
    if site.phase == "outputs":
        ends = [n for n, s in ctx.states.items() if s.is_end and n in tree]
        completed = [n for n in ends if ctx.states[n].end == "completed"] or ends
        target = tree.common_dominator(completed)
        if target is None:
            return None
        return _Dominating(tree, target, frozenset(completed))
    assert site.state is not None
    if site.state not in tree:
        return None  # unreachable: reported on its own
    return _Dominating(tree, site.state, frozenset() if site.phase == "post" else frozenset({site.state}))


def _state_hint(site: Site, used: str) -> str:
    return (
        f'make every path from `start` to "{site.state}" pass through "{used}" first, or guard with '
        f"`{{% if {used} is defined %}}`"
    )


def _use_diagnostics(ctx: LintContext, site: Site, use: NameUse, available: _Dominating | None) -> Diagnostic | None:
    loop = ctx.loop
    def position() -> tuple[int, int]:  # only for a finding: locating costs more than the checks
        return ctx.at_offset(site.path, site.source, use_offset(site.source, use))

    if use.root == "inputs":
        if use.attr is not None and use.attr not in loop.inputs:
            return ctx.diag(
                "unknown-input",
                f'unknown input "{use.attr}"{did_you_mean(use.attr, loop.inputs)}',
                position=position(),
                hint=f"declare it under `inputs:` (declared: {quoted_list(loop.inputs)})",
            )
        return None
    if use.root == "secrets":
        if use.attr is not None and use.attr not in loop.secrets:
            return ctx.diag(
                "unknown-secret",
                f'unknown secret "{use.attr}"{did_you_mean(use.attr, loop.secrets)}',
                position=position(),
                hint=f"list it under `secrets:` (declared: {quoted_list(loop.secrets)})",
            )
        return None
    if use.root == "history":
        if use.attr is not None and use.attr not in ctx.states:
            return ctx.diag(
                "undefined-variable",
                f'history.{use.attr}: there is no state "{use.attr}"{did_you_mean(use.attr, ctx.states)}',
                position=position(),
                hint="`history.<state>` lists the attempts of a state of this loop",
            )
        if (use.attr is not None and site.state is not None and use.attr != site.state
                and site.state not in ctx.reached_from(use.attr)):
            return ctx.diag(
                "undefined-variable",
                f'history.{use.attr}: state "{use.attr}" cannot have run before "{site.state}" '
                "(no path leads from it here), so this is always []",
                position=position(),
                hint=f'read the history of a state that runs before "{site.state}", or move this to a state after "{use.attr}"',
            )
        return None
    if use.root in TEMPLATE_ROOTS:
        return None
    if use.root in ctx.states:
        if available is None or use.root in available:
            return None
        if use.root == site.state:
            return ctx.diag(
                "undefined-variable",
                f'"{use.root}" reads this state\'s own result, which does not exist before its first attempt',
                position=position(),
                hint="read it in an after-gate, a transition guard or a later state; "
                "`feedback` carries the previous attempt's failure",
            )
        where = f'state "{site.state}" reads' if site.state else "top-level `outputs` read"
        return ctx.diag(
            "undefined-variable",
            f'{where} "{use.root}", which may not have run yet: a path from start '
            f'"{loop.start}" avoids it',
            position=position(),
            hint=_state_hint(site, use.root) if site.state else
            'read only states that every path to a `completed` end passes through, or set the value in that end\'s `output`',
        )
    candidates = list(ctx.states) + sorted(TEMPLATE_ROOTS)
    return ctx.diag(
        "undefined-variable",
        f'undefined variable "{use.root}"{did_you_mean(use.root, candidates)}',
        position=position(),
        hint="templates can read inputs, secrets, feedback, run, budget, history, error, item, index "
        "and the results of states by name",
    )


def _whole_secret_counts(site: Site) -> dict[str, int]:
    """How many times each secret is read whole (`{{ secrets.X }}`) in a template site."""
    counts: dict[str, int] = {}
    if site.where == "env":  # an env value passes a secret whole only when it is nothing else
        found = WHOLE_SECRET_RE.fullmatch(site.source)
        return {(found.group(1) or found.group(2)): 1} if found else {}
    if site.mode != "expr":
        for found in WHOLE_SECRET_RE.finditer(site.source):
            name = found.group(1) or found.group(2)
            counts[name] = counts.get(name, 0) + 1
    return counts


def _secret_diagnostic(ctx: LintContext, site: Site, use: NameUse, whole: bool) -> Diagnostic | None:
    """Where a secret may be read: whole in a command's `env:` (the way to pass it), whole
    in a prompt (a warning). Anywhere else, or derived (`secrets.X.split(':')[1]`,
    `secrets.X | int`), the value would be stored or shown where the redactor cannot see it."""
    if use.root != "secrets":
        return None
    if use.attr is not None and use.attr not in ctx.loop.secrets:
        return None  # not a secret at all: unknown-secret reports it
    name = use.attr or "NAME"
    position = ctx.at_offset(site.path, site.source, use_offset(site.source, use))
    pass_it = f'env: {{{name}: "{{{{ secrets.{name} }}}}"}}'
    if site.where == "command":
        return ctx.diag(
            "secret-in-command",
            f"secret {name} is rendered into a command, where it can leak into logs and process lists",
            position=position,
            hint=f'pass it in the command\'s `{pass_it}` and read it as "${name}"',
        )
    if whole and site.where == "env":
        return None
    if whole and site.where == "prompt":
        return ctx.diag(
            "secret-in-prompt",
            f"secret {name} is sent to the model in a prompt",
            position=position,
            severity=Severity.WARNING,
            hint="models and their providers log prompts; pass only what the model needs",
        )
    if site.where in ("env", "prompt"):
        what = f"a value derived from secret {name} is not recognised by the redactor and would be shown in clear"
        hint = f"pass the secret whole (`{pass_it}`) and derive what you need inside the command"
    elif site.where == "with":
        what = f"secret {name} handed to a sub-loop through `with:` would be stored as the child's input"
        hint = f"declare {name} in the child's `secrets:` (a child gets the secrets it declares) and drop this value"
    else:
        what = f"secret {name} is read here, and whatever this renders is stored and shown"
        hint = f"read secrets only in a command's `{pass_it}`"
    return ctx.diag("secret-outside-env", what, position=position, hint=hint)


@rule
def template_rules(ctx: LintContext) -> Iterator[Diagnostic]:
    all_sites = sites(ctx)
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
        available = _available(ctx, site)
        whole = _whole_secret_counts(site)
        reads = [use.attr for use in scanned.uses if use.root == "secrets"]
        seen: set[tuple[str, str | None]] = set()
        for use in scanned.uses:
            key = (use.root, use.attr)
            if key in seen:
                continue
            seen.add(key)
            every_read_whole = use.attr is not None and whole.get(use.attr, 0) >= reads.count(use.attr)
            for found in (_use_diagnostics(ctx, site, use, available),
                          _secret_diagnostic(ctx, site, use, every_read_whole)):
                if found is not None:
                    yield found


def names_read(source: str, expression: bool = False) -> set[str]:
    """Root names a template reads ({} when it does not parse)."""
    try:
        return {use.root for use in scan(source, expression).uses}
    except ScanError:
        return set()
