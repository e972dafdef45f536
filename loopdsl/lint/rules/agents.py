"""Lint rules for v1.1's agents and tools (docs/dsl.md, "Agents and tools").

A tool's shell command goes through the same placeholder rules as a `shell` state: its
`{{ args.X }}` is a placeholder like any other, and only `integer` params may stand where
bash evaluates a value. Unlike a state's command, a param's value is written by a model,
so a placeholder that could be read as an option is an error, not a warning.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...language.agent_model import (
    BUILTIN_TOOLS,
    RESERVED_TOOL_NAMES,
    WRITING_BUILTINS,
    AgentAction,
    ToolDef,
    resolve_tool,
)
from ...language.diagnostics import Diagnostic, Severity
from ...language.files import is_file
from ...language.model import State
from ...language.tool_check import (
    TOOL_RUN_KEYS,
    TOOL_TEMPLATE_ROOTS,
    default_problems,
    names_used,
    optional_without_default,
    schema_problem,
    tool_facts,
)
from ..registry import LintContext, did_you_mean, literal_cwd_problem, quoted_list, rule
from ..template_sites import raw_at


def _agents(ctx: LintContext) -> Iterator[tuple[State, AgentAction]]:
    for state in ctx.states.values():
        if isinstance(state.action, AgentAction):
            yield state, state.action


def _local_tools(ctx: LintContext) -> Iterator[ToolDef]:
    raw = ctx.doc.data.get("tools") if isinstance(ctx.doc.data, dict) else None
    for name in raw if isinstance(raw, dict) else ():
        tool = ctx.loop.tools.get(str(name))
        if tool is not None:
            yield tool




@rule
def unknown_tool(ctx: LintContext) -> Iterator[Diagnostic]:
    known = list(ctx.loop.tools) + list(BUILTIN_TOOLS)
    for state, action in _agents(ctx):
        for use in action.tools:
            if use.name in known or resolve_tool(ctx.loop.tools, use.name) is not None:
                continue
            yield ctx.diag(
                "unknown-tool", f'agent "{state.name}" lists unknown tool "{use.name}"{did_you_mean(use.name, known)}',
                use.path, value=True,
                hint=f"name a tool under `tools:` (defined: {quoted_list(ctx.loop.tools)}) or a built-in "
                f"({', '.join(BUILTIN_TOOLS)})")


@rule
def tool_definitions(ctx: LintContext) -> Iterator[Diagnostic]:
    for tool in _local_tools(ctx):
        if tool.name in RESERVED_TOOL_NAMES:
            what = "is reserved for the tools' arguments" if tool.name == "args" else "is a built-in tool"
            yield ctx.diag("tool-shadows-builtin", f'tool name "{tool.name}" {what}', tool.path,
                           hint="rename the tool; built-in names always mean the built-in")
        if not tool.description.strip() and tool.kind != "mcp":
            yield ctx.diag("tool-description", f'tool "{tool.name}" has no `description`', tool.path,
                           severity=Severity.WARNING,
                           hint="the model chooses tools by their description: say what it does and returns")
        if tool.kind == "mcp" and not tool.allow:
            yield ctx.diag("mcp-allow", f'MCP tool "{tool.name}" has no `allow` list', tool.path,
                           hint="list the server's tools the model may call: `allow: [get_issue, ...]`")
        if tool.kind == "loop" and tool.loop and not is_file(ctx.source.parent / tool.loop):
            yield ctx.diag("missing-file", f'the sub-loop "{tool.loop}" of tool "{tool.name}" does not exist',
                           tool.path + ("loop",), value=True, hint="the path is relative to this loop file's folder")
        elif tool.kind == "loop" and tool.loop:
            yield from _sub_loop_tool(ctx, tool)
        problem = schema_problem(tool)
        if problem is not None:
            yield ctx.diag("tool-params", f'the params of tool "{tool.name}" are not a valid JSON Schema: {problem}',
                           tool.path + ("params",), hint="each param is a JSON Schema such as {type: string}")
            continue
        for _name, message in default_problems(tool):
            yield ctx.diag("tool-params", f'tool "{tool.name}": {message}', tool.path + ("params",),
                           hint="make `default` match the param's schema and list only params under `required`")


@rule
def offered_names(ctx: LintContext) -> Iterator[Diagnostic]:
    """Each name a model is offered means one tool: an MCP entry's allowed tools (`<entry>__<tool>`
    or their `as:`) may not repeat, nor take a built-in's name, nor the name of another tool the
    same agent lists (the run kept only the last, or stopped with an internal error)."""
    for tool in _local_tools(ctx):
        seen: set[str] = set()
        for index, allowed in enumerate(tool.allow if tool.kind == "mcp" else ()):
            name, at = allowed.offered_as(tool.name), tool.path + ("allow", index)
            if name in RESERVED_TOOL_NAMES:
                what = "is reserved for the tools' arguments" if name == "args" else "is a built-in tool"
                yield ctx.diag("tool-shadows-builtin", f'MCP tool "{tool.name}" offers "{name}", which {what}', at,
                               value=allowed.as_ is None, hint="rename it with `as:`; built-in names always mean the built-in")
            elif name in seen:
                yield ctx.diag("duplicate-tool-name", f'MCP tool "{tool.name}" offers "{name}" twice', at,
                               value=allowed.as_ is None, hint="allow each of the server's tools once, under one name")
            seen.add(name)
    for state, action in _agents(ctx):
        owners: dict[str, str] = {}
        for use in action.tools:
            tool = resolve_tool(ctx.loop.tools, use.name)
            for name in dict.fromkeys(tool.offered_names() if tool is not None else ()):
                if owners.setdefault(name, use.name) != use.name:
                    yield ctx.diag("duplicate-tool-name", f'agent "{state.name}" is offered two tools named "{name}" '
                                   f'(from "{owners[name]}" and "{use.name}")', use.path, value=True,
                                   hint="list each tool once; rename an MCP tool with `as:`")


@rule
def tool_commands(ctx: LintContext) -> Iterator[Diagnostic]:
    from ...language.compile import input_facts

    facts = input_facts(ctx.loop)
    for tool in _local_tools(ctx):
        spec = tool.shell
        if spec is None:
            continue
        string_form = isinstance(raw_at(ctx, spec.path), str)
        sources: list[tuple[tuple[Any, ...], str, bool]] = []
        if spec.cmd is not None:
            sources.append((spec.path if string_form else spec.path + ("cmd",), spec.cmd, True))
        sources += [(spec.path + ("argv", i), a, False) for i, a in enumerate(spec.argv or ())]
        for path, source, is_command in sources:
            if is_command:
                yield from _shell_problems(ctx, tool, path, source, tool_facts(facts, tool))
            yield from _name_problems(ctx, tool, path, source)
        yield from _env_and_cwd(ctx, tool)


def _env_and_cwd(ctx: LintContext, tool: ToolDef) -> Iterator[Diagnostic]:
    """A shell tool's `env:` and `cwd:` (as for shell states): a whole `{{ secrets.X }}` env
    value must name a declared secret; every other value and `cwd` see only the tool's roots."""
    spec = tool.shell
    if spec is None or isinstance(raw_at(ctx, spec.path), str):
        return
    passed = spec.secrets_passed
    for key, value in spec.env.items():
        if key in passed:
            if passed[key] not in ctx.loop.secrets:
                yield ctx.diag("unknown-secret", f'tool "{tool.name}": env {key} reads secret "{passed[key]}", which is '
                               f"not declared{did_you_mean(passed[key], ctx.loop.secrets)}",
                               spec.path + ("env", key), value=True, hint="declare it under `secrets:`")
            continue
        yield from _name_problems(ctx, tool, spec.path + ("env", key), value)
    if spec.cwd is not None:
        yield from _name_problems(ctx, tool, spec.path + ("cwd",), str(spec.cwd))
        yield from literal_cwd_problem(ctx, str(spec.cwd), spec.path + ("cwd",))


def _shell_problems(ctx: LintContext, tool: ToolDef, path: tuple[Any, ...], source: str, facts: Any) -> Iterator[Diagnostic]:
    from ...language.templates import analyze_shell

    _command, errors, warnings = analyze_shell(source, facts.with_env(tool.shell.env if tool.shell else {}))
    for problem in [*errors, *warnings]:
        message = problem.message
        if problem.hint and message.endswith(problem.hint):
            message = message[: -len(problem.hint)].rstrip(" ;:,")
        yield ctx.diag(problem.rule, f'tool "{tool.name}": {message}', hint=problem.hint or "",
                       position=ctx.at_offset(path, source, int(problem.offset or 0)))


def _name_problems(ctx: LintContext, tool: ToolDef, path: tuple[Any, ...], source: str) -> Iterator[Diagnostic]:
    optional = optional_without_default(tool)
    seen: set[tuple[str, str | None]] = set()
    for root, attr in names_used(source):
        if (root, attr) in seen:
            continue
        seen.add((root, attr))
        where = ctx.at(path, value=True)
        schema = tool.params.get(str(attr)) if root == "args" else None
        if isinstance(schema, dict) and schema.get("type") in ("array", "object") and path[-1] != "argv" \
                and "argv" not in path:
            yield ctx.diag("tool-scalar-arg", f'tool "{tool.name}" puts args.{attr}, an {schema["type"]}, in a '
                           "command: only scalar params go in `shell`", position=ctx.at(path, value=True),
                           hint="use `argv:` and give the array one element per argument")
        if root == "args" and attr not in tool.params:
            yield ctx.diag("tool-unknown-arg",
                           f'tool "{tool.name}" reads args.{attr}, which is not one of its params'
                           f"{did_you_mean(str(attr), tool.params)}", position=where,
                           hint=f"declare it under `params:` (declared: {quoted_list(tool.params)})")
        elif root == "args" and attr in optional:
            yield ctx.diag("tool-unknown-arg",
                           f'tool "{tool.name}" reads args.{attr}, an optional param without a default',
                           position=where, hint=f"give `{attr}` a `default` or list it under `required`")
        elif root not in TOOL_TEMPLATE_ROOTS or (root == "run" and attr not in TOOL_RUN_KEYS):
            shown = root if attr is None else f"{root}.{attr}"
            yield ctx.diag("tool-template", f'tool "{tool.name}" reads "{shown}"; a tool sees only args, inputs, '
                           "run.id and run.date", position=where,
                           hint="pass what the tool needs as a param, or a secret through `secrets:`")


@rule
def agent_settings(ctx: LintContext) -> Iterator[Diagnostic]:
    for state, action in _agents(ctx):
        if action.cli is None and action.max_turns is None:
            yield ctx.diag("agent-max-turns", f'agent "{state.name}" has no `max_turns`', action.path,
                           hint="bound the conversation: `max_turns: 20` (each turn is a paid model call)")
        if action.cli == "codex" and action.max_turns is not None:
            yield ctx.diag("cli-max-turns", f'agent "{state.name}": codex takes no turn cap', action.path + ("max_turns",),
                           hint="drop `max_turns` and bound the run with the state's `timeout`")
        writers = [u for u in action.tools if u.name in WRITING_BUILTINS]
        if writers and not ctx.loop.workspace.worktree:
            yield ctx.diag("tool-writes-without-worktree",
                           f'agent "{state.name}" lists {writers[0].name} but the loop has no worktree',
                           writers[0].path, value=True,
                           hint="set `workspace: {worktree: true}`: an agent never writes into a person's checkout")
        yield from _secrets_with_writer(ctx, state, action, bool(writers))
        yield from _approve_unattended(ctx, state, action)


def _secrets_with_writer(ctx: LintContext, state: State, action: AgentAction, writes: bool) -> Iterator[Diagnostic]:
    if not writes:
        return
    for use in action.tools:
        tool = ctx.loop.tools.get(use.name)
        if tool is not None and tool.kind == "shell" and tool.secrets and use.name not in BUILTIN_TOOLS:
            yield ctx.diag("tool-secret-with-writer",
                           f'tool "{tool.name}" gets secrets in agent "{state.name}", which can also write files: '
                           "it would run model-written code with them", use.path, value=True,
                           hint="drop the tool's `secrets`, or give the writing tools to another agent")


def _approve_unattended(ctx: LintContext, state: State, action: AgentAction) -> Iterator[Diagnostic]:
    if not ctx.loop.unattended:
        return
    for use in action.tools:
        tool = ctx.loop.tools.get(use.name)
        if use.approve or (tool is not None and tool.approve and use.name not in BUILTIN_TOOLS):
            yield ctx.diag("tool-approve-unattended",
                           f'tool "{use.name}" in agent "{state.name}" needs a person\'s approval, but the loop '
                           "is `unattended`", use.path, value=True,
                           hint="drop `approve`, or drop `unattended: true`")


@rule
def agent_choices(ctx: LintContext) -> Iterator[Diagnostic]:
    """`tool_choice` naming a tool the agent does not list; a CLI agent without
    `max_cost_usd`; `permissions: full` without `unsafe: true` or with secrets in scope."""
    for state, action in _agents(ctx):
        listed = [use.name for use in action.tools]
        if action.tool_choice not in ("auto", "required", "none") and action.tool_choice not in listed:
            yield ctx.diag("agent-tool-choice", f'agent "{state.name}": tool_choice "{action.tool_choice}" is not '
                           f"one of its tools{did_you_mean(action.tool_choice, listed)}", action.path + ("tool_choice",),
                           value=True, hint="use auto, required, none or a tool the agent lists")
        if action.cli is None:
            continue
        if action.max_cost_usd is None:
            yield ctx.diag("cli-max-cost", f'agent "{state.name}" runs {action.cli} without `max_cost_usd`', action.path,
                           hint="a CLI spends on its own key before it reports: `max_cost_usd` is reserved before it starts")
        if action.permissions == "full" and (not action.unsafe or ctx.loop.secrets):
            why = "with secrets in scope" if action.unsafe else "without `unsafe: true`"
            yield ctx.diag("cli-full-permissions", f'agent "{state.name}": `permissions: full` {why}',
                           action.path + ("permissions",), value=True,
                           hint="use `permissions: edit`; `full` lets the CLI run anything, so it needs `unsafe: true` "
                           "and a loop without secrets")


@rule
def agent_unreviewed(ctx: LintContext) -> Iterator[Diagnostic]:
    """An agent that writes files and runs shell tools runs model-written code: its work
    should not reach `completed` without an after-gate and a review (`evaluate`/`checkpoint`)."""
    for state, action in _agents(ctx):
        tools = [resolve_tool(ctx.loop.tools, use.name) for use in action.tools]
        writes = any(t is not None and t.writes for t in tools)
        runs = any(t is not None and t.kind == "shell" for t in tools)
        if not (writes and runs) or (state.gates_after and not _completes_unreviewed(ctx, state.name)):
            continue
        yield ctx.diag("agent-unreviewed", f'agent "{state.name}" writes files and runs commands, and its work can '
                       "reach `completed` without " + ("an after-gate" if not state.gates_after else
                                                       "an `evaluate` or `checkpoint` state"),
                       state.path + ("agent",), severity=Severity.WARNING,
                       hint="add `gates: {after: [...]}` (e.g. the tests) and route through an `evaluate` or "
                       "`checkpoint` state before the `completed` end")


def _completes_unreviewed(ctx: LintContext, start: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for edge in ctx.graph.out.get(todo.pop(), ()):
            dest = ctx.states.get(edge.dest)
            if dest is None or edge.dest in seen or dest.kind in ("evaluate", "checkpoint"):
                continue
            if dest.is_end and dest.end == "completed":
                return True
            seen.add(edge.dest)
            todo.append(edge.dest)
    return False


@rule
def mcp_env(ctx: LintContext) -> Iterator[Diagnostic]:
    """An MCP `env` value is a literal or exactly "$X" of a declared secret."""
    for tool in _local_tools(ctx):
        if tool.mcp is None:
            continue
        for key, value in tool.mcp.env.items():
            named = value[1:] if value.startswith("$") else None
            if named is not None and named not in ctx.loop.secrets:
                yield ctx.diag("mcp-env", f'MCP tool "{tool.name}": env {key} names "${named}", which is not a '
                               f"declared secret{did_you_mean(named, ctx.loop.secrets)}",
                               tool.path + ("mcp", "env", key), value=True,
                               hint="declare it under `secrets:`, or give a literal value")


def _sub_loop_tool(ctx: LintContext, tool: Any) -> Iterator[Diagnostic]:
    """A sub-loop tool runs while the model waits for its result (DSL.md v1.1): it may not
    stop for a person, nor run the loop that calls it."""
    if ctx.analyze_child is None:
        return
    where = tool.path + ("loop",)
    child = ctx.analyze_child(ctx.source.parent / tool.loop, ctx.child_display(tool.loop))
    if child is None:  # already being linted higher up: it reaches its caller
        yield ctx.diag("tool-loop-recursion", f'the sub-loop "{tool.loop}" of tool "{tool.name}" runs a loop '
                       "that is already running it", where, value=True,
                       hint="a sub-loop tool may not reach the loop that calls it: give the tool a loop of its own")
    elif child.loop is not None and not child.loop.unattended:
        yield ctx.diag("tool-loop-attended", f'the sub-loop "{tool.loop}" of tool "{tool.name}" is not '
                       "`unattended: true`", where, value=True,
                       hint="a tool's loop runs while the model waits: set `unattended: true` in it "
                       "(and give it no checkpoint)")

