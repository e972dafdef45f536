"""The `shell:` state: render its command, mark it pending when it must not be repeated
blindly, run it through the shell port and judge its exit."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...language.compile import CompiledState
from ...language.templates import RenderError
from ..errors import StepFailure
from ..process_tree import CommandRef
from ..shell import CwdOutsideWorkspace

if TYPE_CHECKING:
    from ..engine import Engine


async def run_shell_state(engine: "Engine", cs: CompiledState, ctx: dict[str, Any], visit: int, attempt: int) -> dict[str, Any]:
    shell = cs.shell
    assert shell is not None
    env = dict(engine.command_env)
    try:
        for key, template in shell.env.items():
            env[key] = template.render(ctx)
        cwd = engine.ports.workdir
        if shell.cwd is not None:
            cwd = engine.ports.confine_cwd(cwd, shell.cwd.render(ctx))
        if shell.command is not None:
            script, placeholders = shell.command.prepare(ctx)
            env.update(placeholders)
            argv = None
        else:
            script, argv = None, [t.render(ctx) for t in shell.argv or ()]
    except (RenderError, CwdOutsideWorkspace) as exc:
        raise StepFailure("parse", f"rendering the command of '{cs.state.name}': {exc}") from None
    marker = engine.commands.new_marker()
    pending = {"kind": "shell", "state": cs.state.name, "visit": visit, "attempt": attempt, "step_taken": True,
               "command": {"marker": marker}}
    if not cs.state.idempotent:  # committed before it starts: a crash from here on needs a person
        engine._commit_pending(pending)

    def started(ref: CommandRef) -> None:
        # Recorded before it is waited on: after a kill -9 of loopdsl, `resume` finds it still running.
        # Committed with the run's command record, right after this (runtime/commands.py).
        engine.run.pending = dict(pending, command=ref.to_json())

    res = await engine.commands.shell(engine.ports.shell, "shell")(script=script, argv=argv, cwd=cwd, env=env, timeout=shell.spec.timeout, redact=engine.redact,
                            marker=marker, on_start=started)
    result = res.as_result()
    if res.timed_out:
        raise StepFailure("timeout", f"command timed out after {shell.spec.timeout:g}s", result=result)
    if res.exit_code not in shell.spec.ok_exit:
        tail = (res.stderr or res.stdout)[-2000:].strip()
        raise StepFailure("shell_exit", f"command exited with {res.exit_code}" + (f": {tail}" if tail else ""), result=result)
    return result
