"""Semantic lint rules: the checks the JSON Schema cannot express.

Each rule is a small function `(ctx) -> Iterable[Diagnostic]` with a stable rule id,
registered with `@rule`. Rules collect, never raise: the pipeline (lint.py) runs all of
them so one lint shows every problem. This module holds the shared context and the
rules about names, references and the shape of the state graph; the modules of rules/
hold the rest, one topic each (importing them registers their rules).
"""
from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..language.diagnostics import Diagnostic, Severity
from ..language.dominators import DominatorTree
from ..language.model import NAME_RE, RESERVED_NAMES, Loop, State, YamlPath
from ..language.state_graph import LoopGraph

if TYPE_CHECKING:
    from ..language.imports import ImportResult
    from ..language.loader import Document
    from .template_sites import Site as TemplateSite

Rule = Callable[["LintContext"], Iterable[Diagnostic]]
RULES: list[Rule] = []


GRAPH_RULES: set[str] = set()


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def graph_rule(fn: Rule) -> Rule:
    """A rule about the shape of the state graph. Skipped when the schema found errors:
    a misspelt `next` would otherwise also show up as unreachable states and dead ends."""
    GRAPH_RULES.add(fn.__name__)
    return rule(fn)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean "x"?)' for the closest candidate, or ''."""
    match = difflib.get_close_matches(str(name), sorted(set(candidates)), n=1, cutoff=0.6)
    return f' (did you mean "{match[0]}"?)' if match else ""


def quoted_list(names: Iterable[str], limit: int = 8) -> str:
    items = sorted(set(names))
    shown = ", ".join(items[:limit]) + (", ..." if len(items) > limit else "")
    return shown or "none"


@dataclass
class LintContext:
    """What every rule sees: the parsed document, the built loop and helpers."""

    doc: Document
    loop: Loop
    path: str  # the path as the user gave it (shown in diagnostics)
    source: Path  # the file on disk (relative paths in the loop resolve against its folder)
    imported: ImportResult | None = None
    # Lints sub-loop files (with caching and cycle protection); set by lint.py.
    analyze_child: Callable[[Path, str], Any] | None = None
    child_display: Callable[[str], str] = field(default=lambda p: p)
    # False when the schema rejected part of the states' routing (lint.py): the graph as
    # built is incomplete, so nothing is claimed from its paths.
    graph_complete: bool = True

    # ------------------------------------------------------------ positions
    def at(self, yaml_path: YamlPath, *, value: bool = False) -> tuple[int, int]:
        return self.doc.locate(tuple(yaml_path), value=value)

    def diag(
        self,
        rule_id: str,
        message: str,
        yaml_path: YamlPath = (),
        *,
        value: bool = False,
        hint: str = "",
        severity: Severity = Severity.ERROR,
        position: tuple[int, int] | None = None,
        related: tuple[tuple[str, int, int, str], ...] = (),
    ) -> Diagnostic:
        line, col = position if position is not None else self.at(yaml_path, value=value)
        return Diagnostic(self.path, line, col, severity, rule_id, message, hint, related)

    def at_offset(self, yaml_path: YamlPath, source: str, offset: int) -> tuple[int, int]:
        """Line:col of character `offset` of the string value at `yaml_path`.

        The value may be plain, quoted, or a `|`/`>` block scalar, so instead of
        re-deriving YAML's folding rules we look for the text at `offset` in the file,
        starting where the value starts, skipping as many earlier copies of that text as
        the value itself has before `offset`.
        """
        line0, col0 = self.at(yaml_path, value=True)
        offset = max(0, min(offset, len(source)))
        line_end = source.find("\n", offset)
        fragment = source[offset : line_end if line_end >= 0 else len(source)][:40].rstrip()
        if not fragment.strip():
            return line0, col0
        earlier, pos = 0, source.find(fragment)
        while 0 <= pos < offset:
            earlier += 1
            pos = source.find(fragment, pos + 1)
        lines = self.doc.lines
        last = min(len(lines), line0 + 2 * (source.count("\n") + 1) + 20)
        for index in range(line0 - 1, last):
            text = lines[index]
            start = col0 - 1 if index == line0 - 1 else 0
            hit = text.find(fragment, start)
            while hit >= 0:
                if earlier == 0:
                    return index + 1, hit + 1
                earlier -= 1
                hit = text.find(fragment, hit + 1)
        return line0, col0

    @cached_property
    def template_sites(self) -> list[TemplateSite]:
        """Every template, expression and command of the loop (template_sites.py); built
        once, as several rules read them."""
        from .template_sites import sites  # deferred: template_sites refers to this class

        return sites(self)

    # ------------------------------------------------------------ graph
    @property
    def states(self) -> Mapping[str, State]:
        return self.loop.states

    @property
    def graph(self) -> LoopGraph:
        return self.loop.graph

    @property
    def edges(self) -> dict[str, list[str]]:
        """Successors of each state over every edge kind, known destinations only."""
        return self.loop.graph.successors

    @property
    def reachable(self) -> set[str]:
        return self.loop.graph.reachable

    def reached_from(self, source: str) -> set[str]:
        """States some path from `source` leads to (one step at least)."""
        return self.loop.graph.reached_from(source)

    @property
    def predecessors(self) -> dict[str, list[str]]:
        return self.loop.graph.predecessors

    @cached_property
    def dominators(self) -> DominatorTree:
        """Which states every path from `start` to a state passes through. Empty when the graph
        is incomplete: no state is then known to have run before another."""
        return self.loop.graph.dominators if self.graph_complete else DominatorTree(self.loop.start, {})

    @cached_property
    def local_models(self) -> list[str]:
        """Model aliases defined in this file (not imported)."""
        raw = self.doc.data.get("models") if isinstance(self.doc.data, dict) else None
        return [str(k) for k in raw] if isinstance(raw, dict) else []

    @cached_property
    def local_gates(self) -> list[str]:
        raw = self.doc.data.get("gates") if isinstance(self.doc.data, dict) else None
        return [str(k) for k in raw] if isinstance(raw, dict) else []


def state_key(name: str) -> YamlPath:
    return ("states", name)


# ================================================================ names


def _named_things(ctx: LintContext) -> Iterator[tuple[str, str, YamlPath]]:
    """(kind, name, yaml path) of every user-chosen identifier that templates may use."""
    for name in ctx.loop.states:
        yield "state", name, ("states", name)
    for name, spec in ctx.loop.inputs.items():
        yield "input", name, spec.path
    for name in ctx.local_models:  # imported aliases are checked in their own file
        yield "model", name, ("models", name)


@rule
def reserved_name(ctx: LintContext) -> Iterator[Diagnostic]:
    for kind, name, path in _named_things(ctx):
        if kind == "state" and name in RESERVED_NAMES:
            yield ctx.diag(
                "reserved-name",
                f'"{name}" is reserved and cannot name a state',
                path,
                hint=f"templates use `{name}` for something else; rename the state "
                f"(reserved: {quoted_list(RESERVED_NAMES, 20)})",
            )


@rule
def bad_name(ctx: LintContext) -> Iterator[Diagnostic]:
    for kind, name, path in _named_things(ctx):
        if not NAME_RE.match(str(name)):
            yield ctx.diag(
                "bad-name",
                f"{kind} name {json.dumps(str(name), ensure_ascii=False)} must match ^[a-z][a-z0-9_]*$",
                path,
                hint="use lower-case letters, digits and underscores, starting with a letter "
                f'(e.g. "{_suggest_name(str(name))}"), so templates can write it as a variable',
            )


def _suggest_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_") or "x"
    return cleaned if cleaned[0].isalpha() else "s_" + cleaned


@rule
def cwd_outside_workspace(ctx: LintContext) -> Iterator[Diagnostic]:
    """A literal `cwd` that the engine would refuse (shell.confined_cwd) is refused now."""
    for site in ctx.template_sites:
        if site.path[-1] == "cwd":
            yield from literal_cwd_problem(ctx, site.source, site.path)


def literal_cwd_problem(ctx: LintContext, source: str, path: Any) -> Iterator[Diagnostic]:
    """`cwd-outside-workspace` for a literal cwd (shell states, gates, shell tools)."""
    if "{" in source:
        return  # a template is checked when it is rendered
    if Path(source).is_absolute() or ".." in Path(source).parts:
        yield ctx.diag(
            "cwd-outside-workspace",
            f'cwd "{source}" is outside the workspace'
            + (" (an absolute path)" if Path(source).is_absolute() else " (a '..' part)"),
            path,
            value=True,
            hint="name a folder relative to the workspace, e.g. `cwd: src`; commands never run "
            "outside it",
        )


# ================================================================ references


_EDGE_WORDS = {
    "next": "next",
    "route": "transition target",
    "fail": "on_failure",
    "exhaust": "on_exhausted",
    "time_out": "on_timeout",
}


@rule
def unknown_state(ctx: LintContext) -> Iterator[Diagnostic]:
    names = list(ctx.states)
    if ctx.loop.start not in ctx.states:
        yield ctx.diag(
            "unknown-state",
            f'start state "{ctx.loop.start}" is not defined{did_you_mean(ctx.loop.start, names)}',
            ("start",),
            value=True,
            hint=f"`start` must name one of the states: {quoted_list(names)}",
        )
    for state in ctx.states.values():
        for trigger, _source, dest, _when, path in ctx.graph.out[state.name]:
            if dest in ctx.states:
                continue
            yield ctx.diag(
                "unknown-state",
                f'{_EDGE_WORDS[trigger]} of state "{state.name}" names unknown state '
                f'"{dest}"{did_you_mean(dest, names)}',
                path,
                value=True,
                hint=f"define a state `{dest}:` under `states:` or point at one of: {quoted_list(names)}",
            )


# ================================================================ rule catalogue

# Every id the semantic rules, imports and the lint driver report, with its severity and
# what it means: the source for the "Semantic rules" table in docs/dsl.md.
RULE_DOCS: dict[str, tuple[str, str]] = {
    "unknown-tool": ("error", "An agent lists a tool that is neither under `tools:` (or imported) nor built in (with a did-you-mean)."),
    "tool-description": ("warning", "A tool without `description`: the model picks tools by their description."),
    "tool-params": ("error", "A tool's `params` are not a valid JSON Schema, a `default` does not match its param, or `required` names no param."),
    "tool-loop-attended": ("error", "A sub-loop tool's loop is not `unattended: true`: it runs while the model waits for its result, so it may not stop for a person."),
    "tool-loop-recursion": ("error", "A sub-loop tool's loop runs the loop that calls it (directly or through its own sub-loops)."),
    "tool-unknown-arg": ("error", "A tool's command reads `args.X` for an X that is not a param, or an optional param without a default."),
    "tool-template": ("error", "A tool's command reads something other than `args`, `inputs`, `run.id` and `run.date`."),
    "tool-shadows-builtin": ("error", "A tool named like a built-in tool or `args`, or an MCP tool offered under such a name."),
    "duplicate-tool-name": ("error", "Two tools offered under one name: an MCP entry allowing a tool twice, or an agent listing tools whose offered names collide (an `as:` naming another tool)."),
    "tool-writes-without-worktree": ("error", "An agent lists `write_file` or `edit_file` in a loop without `workspace: {worktree: true}`."),
    "tool-secret-with-writer": ("error", "A shell tool that gets secrets, in an agent that can also write files (it would run model-written code with them)."),
    "tool-approve-unattended": ("error", "A tool that needs a person's approval in an `unattended` loop."),
    "agent-max-turns": ("error", "An agent without `max_turns`."),
    "mcp-allow": ("error", "An MCP tool without `allow`."),
    "cli-max-turns": ("error", "`max_turns` on a `cli: codex` agent: codex takes no turn cap."),
    "tool-scalar-arg": ("error", "An `array` or `object` param in a tool's `shell` command (only scalars; arrays go in `argv`)."),
    "cli-max-cost": ("error", "A `cli:` agent without `max_cost_usd`."),
    "cli-full-permissions": ("error", "`permissions: full` on a `cli:` agent without `unsafe: true`, or with secrets in scope."),
    "agent-tool-choice": ("error", "`tool_choice` names a tool the agent does not list."),
    "agent-unreviewed": ("warning", "An agent that writes files and runs shell tools can reach `completed` without an after-gate and an `evaluate` or `checkpoint`."),
    "mcp-env": ("error", "An MCP `env` value `$X` names no declared secret."),
    "unknown-state": ("error", "`start`, `next`, a transition, `on_failure`, `on_exhausted` or `on_timeout` names a state that does not exist (with a did-you-mean)."),
    "unknown-model": ("error", "An `llm`/`evaluate` `model` is not an alias under `models` (or imported)."),
    "unknown-gate": ("error", "A gate reference names no gate under `gates` (or imported) and no built-in."),
    "unknown-input": ("error", "A template reads `inputs.X` for an input that is not declared."),
    "unknown-secret": ("error", "A template reads `secrets.X` for a secret that is not declared."),
    "reserved-name": ("error", "A state is named after a template variable (`inputs secrets feedback run budget history item index error`)."),
    "bad-name": ("error", "A state, input or model alias name does not match `^[a-z][a-z0-9_]*$`."),
    "unreachable-state": ("error", "No path from `start` reaches the state."),
    "no-path-to-end": ("error", "A state (or a group of states that only lead to each other) from which no `end` state can be reached."),
    "unbounded-cycle": ("error", "A cycle in which no state has `max_visits` and the budget sets no `steps` or `wall_time` (nor, for a cycle that calls a model, `tokens`/`cost_usd`)."),
    "no-default-transition": ("error", "Every entry of `transitions` has a `when`: when none is true the run fails (`no_transition`)."),
    "expr-syntax": ("error", "A `when`, gate `expr`, `set` value or `for_each` is not a valid Jinja expression."),
    "template-syntax": ("error", "A prompt, message, output, argument or `with` value is not a valid Jinja template (or uses an unknown filter)."),
    "undefined-variable": ("error", "A template reads a name that is not defined, or a state that may not have run yet on some path to it (including a state's own result before its first attempt)."),
    "shell-quote-single": ("error", "A `{{ }}` placeholder inside single quotes in a command."),
    "shell-quote-heredoc": ("error", "A placeholder inside a here-document."),
    "shell-quote-backtick": ("error", "A placeholder inside backticks."),
    "shell-statement": ("error", "A `{% %}` statement in a command."),
    "shell-arithmetic": ("error", "A placeholder where bash evaluates arithmetic (`$(( ))`, `(( ))`, `[[ -eq ]]`, `let`, `declare -i`, an array index, `${s:off}`) that is not proven an integer (an `integer` input, `run.attempt`, `| int`)."),
    "shell-name": ("error", "A placeholder where bash reads a variable name (`[[ -v ]]`, `read`, `printf -v`, `declare`, `local -n`, `unset`, `${!x}`)."),
    "shell-code": ("error", "A placeholder bash runs as code (`eval`, `bash -c`, `trap`, `source`, `compgen -W`, an `awk`/`sed` program, `xargs sh -c`, `find -exec sh -c`), or a shell reading code from its input, `argv: [sh, -c, ...]` with a placeholder in the script, or a template value for `PS4`, `BASH_ENV`, `PATH` and the like (also in `env:`)."),
    "shell-command-name": ("error", "A placeholder that names the program to run."),
    "shell-place": ("error", "A placeholder anywhere else the shell rule does not allow."),
    "shell-syntax": ("error", "A shell command that does not parse as bash."),
    "shell-option": ("warning", "A placeholder operand of a command that parses options (`git`, `grep`, `rm`, ...) with no `--` before it."),
    "shell-escaped-placeholder": ("error", "A placeholder right after a backslash or a `$`."),
    "shell-unsafe-raw": ("error", "`unsafe_raw` in a shell command."),
    "cwd-outside-workspace": ("error", "A literal `cwd` that is absolute or has a `..` part: commands run inside the workspace (a rendered `cwd` that leads out fails its state)."),
    "secret-in-command": ("error", "`{{ secrets.X }}` in a command, its arguments, a shell gate or `cwd`: pass it in `env: {X: \"{{ secrets.X }}\"}` and read \"$X\"."),
    "secret-in-prompt": ("warning", "`{{ secrets.X }}` in a prompt, system message or criterion."),
    "secret-outside-env": ("error", "`secrets.X` read anywhere but whole in a command's `env:` or a prompt (a `with:` value, `set`, an output, a guard, a message), or a value derived from a secret (`secrets.X.split(':')[1]`, `secrets.X | int`): it would be stored or shown unredacted."),
    "secret-not-passed": ("error", "A command reads `$X` for a declared secret X that its `env:` does not pass: commands get only the secrets their `env:` names."),
    "secret-with-model-output": ("warning", "A command that gets secrets runs a model's output: its template reads a model's reply, or another command writes one (to a file it may run)."),
    "llm-max-tokens": ("error", "An `llm`/`evaluate` call without `max_tokens` on the call or its alias."),
    "max-tokens-over-limit": ("warning", "A `max_tokens` (of an alias or a call) more than a model of the alias writes, per LiteLLM's price table (`max_output_tokens`): the provider refuses the call."),
    "params-cost": ("error", "A key under a model alias's `params` (at any depth, e.g. inside `extra_body`) that changes what a call costs: `n`, `best_of`, `candidate_count`, `max_tokens`, `max_completion_tokens`, `max_output_tokens`, `max_new_tokens`, `num_predict`, `thinking`, `thinking_budget`, `budget_tokens`, `service_tier`, and `model`, `messages`, `fallbacks`, `context_window_fallback_dict` (any case, `_` or `-`). Use the alias's `max_tokens` and `budget:`."),
    "unknown-price": ("error", "A model (an alias's model or a fallback) with no price in LiteLLM's table and no alias `price`."),
    "checkpoint-unattended": ("error", "A `checkpoint` in a loop marked `unattended: true`."),
    "evaluator-mirrors-generator": ("warning", "An `evaluate` state uses the same model and temperature as the `llm` state it judges."),
    "gate-needs-value": ("error", "A built-in gate in `before` without `value`: there is no result to check yet."),
    "missing-file": ("error", "A skill, import or sub-loop file that does not exist."),
    "skill-sections": ("warning", "A SKILL.md without the headings WHEN, READ, JUDGE, OUTPUT and STOP."),
    "with-unknown-input": ("error", "A `with:` key that the sub-loop's `inputs` do not accept."),
    "with-missing-input": ("error", "A required input of the sub-loop is not given in `with:`."),
    "with-type": ("error", "A literal `with:` value of the wrong type for the sub-loop's input."),
    "child-invalid": ("error", "The sub-loop file has lint errors (the first ones are shown)."),
    "child-secret": ("error", "The sub-loop declares a secret that this loop does not."),
    "loop-recursion": ("warning", "A sub-loop runs a loop that is already running it."),
    "import-cycle": ("error", "Imported files import each other (both places are shown)."),
    "import-clash": ("error", "Two gates or models of the same name, from imports or the loop itself (both places are shown)."),
    "import-invalid": ("error", "An imported file has keys other than `gates`, `models`, `imports`, `loopdsl`, `description`, or a malformed gate or model."),
    "notify-status": ("error", "A `notify` entry's `on` names a status a run never stops in (with a did-you-mean); statuses: waiting, completed, failed, escalated, budget_exhausted, aborted."),
    "notify-url": ("error", "A `notify` webhook that is not an http(s) URL with a host (or is a template: read a URL from a secret with `secret: NAME`)."),
    "notify-url-credential": ("error", "A literal `notify` webhook URL that carries a credential (user:password@, a token-like query key or path part, a Slack, Discord, Teams, Telegram or Google Chat webhook): put the URL in a declared secret and write `secret: NAME`."),
    "notify-secret": ("error", "A `notify` entry's `secret` is not declared under `secrets`."),
    "publish-token": ("error", "`publish` authenticates with a secret (`token`, default GITHUB_TOKEN) that is not declared under `secrets`."),
    "publish-worktree": ("error", "`publish: pull_request` in a loop without `workspace: {worktree: true}`: the run has no branch to push."),
    "publish-number": ("error", "A `publish` comment, labels or review that names no issue or pull request (`number:`) and refers to none the same `publish` opens."),
    "publish-ends": ("error", "A `publish.ends` entry that is not a state with `end: completed` (publishing happens only after a completed end)."),
    "publish-branch": ("error", "A fixed `publish` pull-request branch that is a template, not a valid branch name, or the branch it merges into (`base`, `workspace.base`, main/master): each run force-pushes it."),
    "on-input-unknown": ("error", "An `on:` trigger maps the event into an input the loop does not declare (with a did-you-mean)."),
    "on-event-path": ("error", "An `on:` input mapping is not an `event.` path, or names a field the event's payload does not have (the known fields are shown)."),
    "on-input-type": ("error", "An `on:` input mapping reads a payload field whose type cannot become the input's declared type (a title into an integer input)."),
    "on-input-missing": ("error", "A run started by an `on:` trigger would have no value for a required input without a default."),
    "bad-schedule": ("error", "`schedule.cron` is not a valid five-field cron expression or matches no date (February 30), or `schedule.timezone` is not a known time zone."),
    "no-such-file": ("error", "A path given to `loopdsl lint` does not exist."),
    "file-unreadable": ("error", "A file that cannot be read."),
    "internal-error": ("error", "A bug in loopdsl (exit code 3); the other findings are still reported."),
}
