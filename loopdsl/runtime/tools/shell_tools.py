"""Shell tools: a loop's `tools:` entries with `shell:`, offered to an agent's model.

A call's arguments are model-written, so they are checked before anything runs: the
params' defaults are filled in, then the whole object is validated against the params
(extra arguments refused). `{{ args.X }}` reaches bash the way every placeholder does, as
a quoted environment variable (language/shell_command.py), through the one shell runner
(runtime/shell.py), in its own session, with only PATH HOME LANG TERM TMPDIR, the
secrets the tool lists and its `env:` (as for shell states: a value is a literal, a template
over args/inputs/run, or exactly `{{ secrets.X }}` of a declared secret). `cwd:` renders the
same way and is confined to the workspace. Output is redacted for every secret of the run,
then capped.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...language.agent_model import ToolDef, ToolUse
from ...language.templates import RenderError, ShellCommand, TemplateError, compile_shell, compile_template
from ...language.tool_check import tool_facts
from ..process_tree import CommandRef, new_marker
from ..shell import CwdOutsideWorkspace, confined_cwd
from .base import ToolOutcome, ToolSpec, check_names, safe_output
from .registry import ToolEnv


def apply_defaults(tool: ToolDef, args: Mapping[str, Any], fixed: Mapping[str, Any]) -> dict[str, Any]:
    """The model's arguments, with the agent's fixed ones (`with:`) over them and each
    missing param's `default` filled in."""
    merged = dict(args)
    merged.update(fixed)
    for name, schema in tool.params.items():
        if name not in merged and isinstance(schema, Mapping) and "default" in schema:
            merged[name] = schema["default"]
    return merged


def argument_errors(tool: ToolDef, args: Any) -> str | None:
    """Why `args` is not acceptable for `tool` (JSON Schema of its params), or None."""
    from ...language.user_schema import InvalidSchema, SchemaTimeout, schema_errors

    if not isinstance(args, Mapping):
        return "arguments must be a JSON object"
    try:
        problems = schema_errors(tool.parameters_schema(), dict(args))
    except (InvalidSchema, SchemaTimeout) as exc:
        return f"cannot check the arguments: {exc}"
    return "invalid arguments: " + "; ".join(problems[:5]) if problems else None


def confinement_error(tool: ToolDef, args: Mapping[str, Any], workdir: Any) -> str | None:
    """A `format: workspace-path` param is confined like a built-in tool's path before the
    command runs: relative, no '..', no .git, no symlink on the way out of the workspace."""
    import os
    import stat

    from .confined import ConfinedRoot, PathRefused, split_path

    for name, schema in tool.params.items():
        if not (isinstance(schema, Mapping) and schema.get("format") == "workspace-path") or name not in args:
            continue
        root = ConfinedRoot(workdir)
        try:
            parts = split_path(args[name], allow_root=True)
            if parts:
                fd = root.open_dir(parts[:-1])
                try:
                    info = os.lstat(parts[-1], dir_fd=fd)
                    if stat.S_ISLNK(info.st_mode):
                        raise PathRefused(f"{args[name]!r} is a symbolic link; tools never follow links")
                except FileNotFoundError:
                    pass  # a path the command may create
                finally:
                    os.close(fd)
        except PathRefused as exc:
            return f"{name}: {exc}"
        finally:
            root.close()
    return None


class ShellToolBox:
    """The shell tools one agent lists, for one attempt."""

    def __init__(self, tools: Sequence[tuple[ToolDef, ToolUse]], env: ToolEnv) -> None:
        self.env = env
        self.tools = {tool.name: (tool, use) for tool, use in tools}
        self._specs = check_names([
            ToolSpec(tool.name, tool.description, tool.parameters_schema(), idempotent=tool.idempotent)
            for tool, _use in tools])
        self._commands: dict[str, ShellCommand | None] = {}
        for tool, _use in tools:
            spec = tool.shell
            assert spec is not None
            # Compiled once per attempt; lint has refused any command that does not compile.
            self._commands[tool.name] = compile_shell(spec.cmd, tool_facts(env.facts, tool).with_env(spec.env)) if spec.cmd else None

    def specs(self) -> Sequence[ToolSpec]:
        return list(self._specs.values())

    async def call(self, name: str, args: Mapping[str, Any], *, call_id: str, timeout: float) -> ToolOutcome:
        started = time.monotonic()
        found = self.tools.get(name)
        if found is None:
            return ToolOutcome.failure(f"unknown tool {name!r}")
        tool, use = found
        full = apply_defaults(tool, args, use.with_)
        problem = argument_errors(tool, full) or confinement_error(tool, full, self.env.workdir)
        if problem is not None:
            return ToolOutcome.failure(problem)
        try:
            script, argv, placeholders = self._prepare(tool, full)
            env, cwd = self._environment(tool, full)
        except (RenderError, TemplateError, CwdOutsideWorkspace) as exc:
            return ToolOutcome.failure(f"the arguments cannot be used in the command: {exc}")
        env.update(placeholders)

        def started_process(ref: CommandRef) -> None:
            self.env.on_process(call_id, ref.to_json())

        res = await self.env.shell(script=script, argv=argv, cwd=cwd, env=env,
                                   timeout=min(timeout, tool.timeout), redact=self.env.redact,
                                   marker=new_marker(), on_start=started_process)
        return self._outcome(res, tool, started)

    def _prepare(self, tool: ToolDef, args: Mapping[str, Any]) -> tuple[str | None, list[str] | None, dict[str, str]]:
        context = {"args": dict(args), "inputs": dict(self.env.inputs), "run": dict(self.env.run)}
        command = self._commands[tool.name]
        if command is not None:
            script, placeholders = command.prepare(context)
            return script, None, placeholders
        spec = tool.shell
        assert spec is not None and spec.argv is not None
        return None, [compile_template(a).render(context) for a in spec.argv], {}

    def _environment(self, tool: ToolDef, args: Mapping[str, Any]) -> tuple[dict[str, str], Any]:
        """The command's environment and working folder: the base keys, the listed secrets,
        then `env:` (a whole `{{ secrets.X }}` passes that declared secret; anything else is
        rendered over args/inputs/run, so a secret cannot be derived into a value); `cwd:`
        rendered likewise and confined to the workspace (a model-written part cannot lead out)."""
        spec = tool.shell
        assert spec is not None
        env = self.env.base_env()
        env.update({k: self.env.secret_values.get(k, "") for k in tool.secrets})
        passed = spec.secrets_passed
        context = {"args": dict(args), "inputs": dict(self.env.inputs), "run": dict(self.env.run)}
        for key, value in spec.env.items():
            if key in passed:
                if passed[key] not in self.env.secret_values:
                    raise RenderError(f"env {key} names secret {passed[key]!r}, which is not declared")
                env[key] = self.env.secret_values[passed[key]]
            else:
                env[key] = compile_template(value).render(context)
        cwd = self.env.workdir
        if spec.cwd is not None:
            cwd = confined_cwd(cwd, compile_template(str(spec.cwd)).render(context))
        return env, cwd

    def _outcome(self, res: Any, tool: ToolDef, started: float) -> ToolOutcome:
        """Each stream redacted on its whole text, then cut: stdout keeps three quarters of
        the limit (a test run's summary comes last), stderr a quarter."""
        limit = self.env.output_limit
        out, cut_out = safe_output(res.stdout, limit=limit * 3 // 4, redact=self.env.redact)
        err, cut_err = safe_output(res.stderr, limit=limit // 4, redact=self.env.redact)
        payload = {"exit_code": res.exit_code, "stdout": out, "stderr": err}
        duration = time.monotonic() - started
        truncated = cut_out or cut_err
        if res.timed_out:
            return ToolOutcome(ok=False, error=f"timed out after {tool.timeout:g}s", result=payload,
                               duration_s=duration, truncated=truncated)
        if res.exit_code != 0:  # the model still sees the output (agent.tool_content)
            return ToolOutcome(ok=False, error=f"exit code {res.exit_code}", result=payload, duration_s=duration,
                               truncated=truncated)
        return ToolOutcome(ok=True, result=payload, truncated=truncated, duration_s=duration)

    async def aclose(self) -> None:
        return None  # each call's process group is gone when the call returns (shell.run_command)


async def open_shell_tools(tools: Sequence[tuple[ToolDef, ToolUse]], env: ToolEnv) -> ShellToolBox:
    return ShellToolBox(tools, env)
