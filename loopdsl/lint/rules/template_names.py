"""What the names a template reads must be: declared inputs and secrets, states that surely
ran before the template is evaluated, and secrets read only where they cannot leak."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...language.diagnostics import Diagnostic, Severity
from ...language.dominators import DominatorTree
from ...language.model import WHOLE_SECRET_RE
from ...language.template_scan import NameUse, use_offset
from ..registry import LintContext, did_you_mean, quoted_list
from ..template_sites import TEMPLATE_ROOTS, Site

@dataclass(frozen=True)
class _Dominating:
    """The states that dominate `target`, less `excluded`: results surely set there."""

    tree: DominatorTree
    target: str
    excluded: frozenset[str]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name not in self.excluded and self.tree.dominates(name, self.target)


def available_states(ctx: LintContext, site: Site) -> _Dominating | None:
    """States whose results are surely set when `site` is evaluated; None: do not check."""
    if site.phase == "definition":
        return None
    tree = ctx.dominators
    if site.phase in ("outputs", "publish"):
        ends = [n for n, s in ctx.states.items() if s.is_end and n in tree]
        completed = [n for n in ends if ctx.states[n].end == "completed"] or ends
        chosen = getattr(ctx.loop.publish, "ends", ()) if site.phase == "publish" else ()
        completed = [n for n in completed if n in chosen] or completed
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


Locate = Callable[[], tuple[int, int]]


def use_diagnostic(ctx: LintContext, site: Site, use: NameUse, available: _Dominating | None) -> Diagnostic | None:
    """The problem with one name `site` reads, if any."""
    def position() -> tuple[int, int]:  # only for a finding: locating costs more than the checks
        return ctx.at_offset(site.path, site.source, use_offset(site.source, use))

    if use.root in _DECLARED:
        return _undeclared(ctx, use, position)
    if use.root == "history":
        return _history_use(ctx, site, use, position)
    if use.root in TEMPLATE_ROOTS:
        return None
    if use.root in ctx.states:
        return _state_use(ctx, site, use, available, position)
    candidates = list(ctx.states) + sorted(TEMPLATE_ROOTS)
    return ctx.diag(
        "undefined-variable",
        f'undefined variable "{use.root}"{did_you_mean(use.root, candidates)}',
        position=position(),
        hint="templates can read inputs, secrets, feedback, run, budget, history, error, item, index "
        "and the results of states by name",
    )


# root -> (rule id, what it names, where to declare it)
_DECLARED = {"inputs": ("unknown-input", "input", "declare it under `inputs:`"),
             "secrets": ("unknown-secret", "secret", "list it under `secrets:`")}


def _undeclared(ctx: LintContext, use: NameUse, position: Locate) -> Diagnostic | None:
    """`inputs.X` or `secrets.X` that the loop does not declare."""
    rule_id, noun, how = _DECLARED[use.root]
    declared = ctx.loop.inputs if use.root == "inputs" else ctx.loop.secrets
    if use.attr is None or use.attr in declared:
        return None
    return ctx.diag(rule_id, f'unknown {noun} "{use.attr}"{did_you_mean(use.attr, declared)}',
                    position=position(), hint=f"{how} (declared: {quoted_list(declared)})")


def _history_use(ctx: LintContext, site: Site, use: NameUse, position: Locate) -> Diagnostic | None:
    """`history.X`: X must be a state that can run before this site."""
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


def _state_use(ctx: LintContext, site: Site, use: NameUse, available: _Dominating | None,
               position: Locate) -> Diagnostic | None:
    """A state's result: it must surely have been set on every path that reaches the site."""
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
    where = (f'state "{site.state}" reads' if site.state else
             "`publish` reads" if site.phase == "publish" else "top-level `outputs` read")
    return ctx.diag(
        "undefined-variable",
        f'{where} "{use.root}", which may not have run yet: a path from start '
        f'"{ctx.loop.start}" avoids it',
        position=position(),
        hint=_state_hint(site, use.root) if site.state else
        'read only states that every path to a `completed` end passes through, or set the value in that end\'s `output`',
    )


def whole_secret_counts(site: Site) -> dict[str, int]:
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


def secret_diagnostic(ctx: LintContext, site: Site, use: NameUse, whole: bool) -> Diagnostic | None:
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
