"""The activities: everything a run does to the world, run by a worker in its repository.

Each returns plain JSON. A provider error comes back as data, not as an exception, so that
the engine (not Temporal) decides what happens next; Temporal never retries an activity
(`wire.ONCE`). While an activity works it heartbeats, which is how a dead worker is told
from a slow call.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from ...language.errors import LoopdslError
from ...runtime.model_port import LlmRequest, ProviderError
from ...runtime.run_keys import default_store_dir
from ..git_worktree import WorkspaceError
from ...runtime.shell import CwdOutsideWorkspace, confined_cwd, run_command
from . import loops, sealed
from .payloads import PayloadTooLarge, fitted
from .wire import FINISH, GIT, LLM, PREPARE, PUBLISH, SHELL, TOOL, WORKER_STOPPED


@contextlib.asynccontextmanager
async def _heartbeating(every: float) -> AsyncIterator[None]:
    """Heartbeats while the body runs. A body cancelled because this worker is stopping fails as
    WORKER_STOPPED, which the workflow takes as a lost worker (wf_ports.worker_lost): the call
    may have been paid, the command may have run part-way. (The SDK would report it as
    cancelled, which the workflow, having cancelled nothing, could only take as a failure.)"""
    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every)

    task = asyncio.create_task(beat())
    try:
        yield
    except asyncio.CancelledError:
        if activity.is_worker_shutdown():
            # Benign: the SDK then logs it at debug level; the worker says it is stopping already.
            raise ApplicationError("the worker running this was asked to stop", type=WORKER_STOPPED,
                                   non_retryable=True, category=ApplicationErrorCategory.BENIGN) from None
        raise
    finally:
        task.cancel()


def _beat_interval() -> float:
    timeout = activity.info().heartbeat_timeout
    return max(timeout.total_seconds() / 3, 0.2) if timeout else 10.0


# Changed files an agent's result names at most when the full list cannot enter the history.
FILES_KEPT = 2_000


class LoopActivities:
    """`base_env` gives the environment commands start from (the worker's, without
    credentials; the API layer decides what that is)."""

    def __init__(self, base_env: Callable[[], Mapping[str, str]], *, models: bool = True):
        self.base_env = base_env
        self.models = models  # False: `loopdsl worker --no-models`, which has not imported LiteLLM
        self._provider: Any = None

    @activity.defn(name=PREPARE)
    async def prepare(self, req: dict[str, Any]) -> dict[str, Any]:
        """Loads the run's loop on this worker; the hashes become the run's record of its files."""
        try:
            loaded = loops.load(req["loop_path"], req.get("script"), req.get("files"), fresh=bool(req.get("fresh")))
        except loops.FilesChanged as exc:
            return {"error": str(exc), "kind": "changed_files"}
        except Exception as exc:  # a lint error, a missing file: the run ends with the message
            return {"error": f"{type(exc).__name__}: {exc}", "kind": "load"}
        out: dict[str, Any] = {"files": dict(loaded.files), "host": loops.worker_host()}
        if req.get("timezone"):
            from datetime import datetime

            from ...language.schedules import time_zone

            # The date the schedule meant, in its zone (a late or buffered run keeps it).
            when = datetime.fromisoformat(req["scheduled"]) if req.get("scheduled") else datetime.now().astimezone()
            out["date"] = when.astimezone(time_zone(req["timezone"])).date().isoformat()
        loop = loaded.compiled.loop
        if loop.publish is not None and req.get("publish") and not req.get("child"):
            from ..github.publisher import check_ready

            try:  # before the run spends anything: this worker can publish (library, repository, token)
                check_ready(loop.publish.token)
            except LoopdslError as exc:
                return {"error": f"the worker cannot publish: {exc.message}; {exc.hint} where the worker runs; "
                                 "or `loopdsl run --temporal ... --no-publish` "
                                 "keeps the run's result on its branch", "kind": "publish"}
        if loop.workspace.worktree and not req.get("child"):  # a child works in its caller's worktree
            try:
                out["worktree"] = self._new_worktree(req["run_id"], loop.workspace.base)
            except WorkspaceError as exc:
                return {"error": f"{exc.message}; {exc.hint}", "kind": "workspace"}
        return out

    def _new_worktree(self, run_id: str, base: str) -> dict[str, Any]:
        from ..git_worktree import create_worktree, find_repo_root

        root = loops.root()
        repo = find_repo_root(root)
        if repo is None:
            raise WorkspaceError(f"the loop runs in a git worktree but the worker's folder {root} is not a git repository",
                                 "start the worker inside the repository the loop works on")
        wt = create_worktree(repo, default_store_dir(root) / "worktrees", run_id, base)
        # Relative to the worker's root: the engine's workdir is `root / path` on whichever worker replays.
        return {"path": loops.relative(wt.path, root), "branch": wt.branch, "repo": str(wt.repo),
                "base_commit": wt.base_commit, "kept": True}

    @activity.defn(name=FINISH)
    async def finish(self, req: dict[str, Any]) -> dict[str, Any]:
        """Commits a completed run's worktree onto its branch (as the local backend does)."""
        from ..git_worktree import SecretInCommit, Worktree, finish_worktree

        info = req["worktree"]
        root = loops.root()
        wt = Worktree(repo=Path(info["repo"]), path=root / info["path"], branch=info["branch"],
                      base_commit=info["base_commit"])
        try:
            return {"commit": await asyncio.to_thread(finish_worktree, wt, req["message"], ())}
        except SecretInCommit as exc:
            return {"error": f"{exc.message}; {exc.hint}"}

    @activity.defn(name=PUBLISH)
    async def publish(self, req: dict[str, Any]) -> dict[str, Any]:
        """One planned `publish:` write (wf_publish.py), with the token of this worker's environment."""
        from ...runtime.redaction import find_secrets
        from ..git_worktree import find_repo_root
        from ..github.publisher import GitHubPublisher

        item = req["item"]
        secrets = tuple(sealed.values_for(req.get("secrets") or ()).values())
        found = [f"{key} holds {what}" for key in ("title", "body") if isinstance(item.get(key), str)
                 for what in find_secrets(item[key], secrets)]
        if found:  # the workflow scanned placeholders; here the values themselves
            return {"error": "nothing was written: " + "; ".join(found[:4]),
                    "hint": "keep secrets out of what `publish:` prints"}
        async with _heartbeating(_beat_interval()):
            try:
                publisher = GitHubPublisher(req["token"], find_repo_root(loops.root()))
                result = await asyncio.to_thread(publisher.write, item, req.get("number"), bool(req.get("resumed")))
            except LoopdslError as exc:
                return {"error": exc.message, "hint": exc.hint}
            except Exception as exc:  # noqa: BLE001 - recorded as the publish's failure, the run stands
                return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return {"result": result}

    @activity.defn(name=GIT)
    async def git(self, req: dict[str, Any]) -> dict[str, Any]:
        """One call of an agent attempt's git port (wf_git.py) on this worker's copy of the run's worktree."""
        from ..git_worktree import find_repo_root

        root = loops.root()
        path, op = root / req["path"], req["op"]
        repo = find_repo_root(root)
        if repo is None or not path.is_dir():
            return {"error": f"the run's worktree {req['path']} is not on this worker ({root})",
                    "hint": "run every worker of the task queue in the same repository"}
        try:
            async with _heartbeating(_beat_interval()):
                return await self._git_op(op, repo, path, req)
        except LoopdslError as exc:  # e.g. a worktree git cannot read: the attempt fails with it
            return {"error": exc.message, "hint": exc.hint}

    async def _git_op(self, op: str, repo: Path, path: Path, req: dict[str, Any]) -> dict[str, Any]:
        from ..git_guard import describe_changes, guard_repository
        from ..git_snapshot import reset_workspace, visit_start, workspace_changes

        if op == "visit_start":
            return {"sha": await asyncio.to_thread(visit_start, path)}
        if op == "changes":
            files, stat = await asyncio.to_thread(workspace_changes, path, req["since"])
            try:
                return fitted({"files": files, "stat": stat}, "the agent's changes", cut=True)
            except PayloadTooLarge:  # tens of thousands of files: the first ones, and the stat
                return fitted({"files": files[:FILES_KEPT], "stat": stat}, "the agent's changes", cut=True)
        if op == "reset":
            await asyncio.to_thread(reset_workspace, path, req["since"])
            return {}
        guard = await asyncio.to_thread(guard_repository, repo, req["branch"])
        if op == "guard":
            return {"taken": guard.before}
        guard.before = dict(req["taken"])  # as taken before the attempt, maybe on another worker
        changes = await asyncio.to_thread(guard.changes)
        return {"problem": describe_changes(changes) if changes else None}

    def _model(self) -> Any:
        if self._provider is None:
            from ..litellm import LiteLLMProvider

            self._provider = LiteLLMProvider()
        return self._provider

    @activity.defn(name=LLM)
    async def llm(self, req: dict[str, Any]) -> dict[str, Any]:
        """Exactly one provider call; the key is read here, by name, from the worker's environment."""
        used = sealed.named_in(str(m.get("content", "")) for m in req["messages"])
        if used:
            return {"error": {"kind": "auth", "billed": False, "retry_after": None,
                              "message": f"the prompt uses secret {', '.join(sorted(used))}: on the Temporal backend a "
                                         "prompt may not carry a secret (the request is kept in the workflow's "
                                         "history); pass it to a command through `env:` instead"}}
        if not self.models:  # importing LiteLLM now could stall this worker's workflow activations
            return {"error": {"kind": "auth", "billed": False, "retry_after": None,
                              "message": f"state '{req['state']}' calls a model, but this worker was started with "
                                         "--no-models: start a worker without that flag, or run the loop with "
                                         "`--script FILE`"}}
        key_env = req.pop("api_key_env", None)
        state = req.pop("state")
        declared = req.pop("secrets", None) or ()
        request = LlmRequest(**req, api_key=os.environ.get(key_env) if key_env else None)
        async with _heartbeating(_beat_interval()):
            try:
                response = await self._model().complete(request, state=state)
            except ProviderError as exc:
                return {"error": {"kind": exc.kind, "message": exc.message, "retry_after": exc.retry_after,
                                  "billed": exc.billed}}
        # A reply may quote a declared secret or a credential of this worker's environment (the
        # model read one in a file): the history keeps the reply, so it is redacted here.
        reply = sealed.redactor(sealed.values_for(declared)).redact_obj(asdict(response))
        try:
            return fitted({"response": reply}, f"model call of state '{state}'", cut=False)
        except PayloadTooLarge as exc:  # paid, but too big to keep: the engine charges it and fails the attempt
            return {"error": {"kind": "server_error", "message": str(exc), "retry_after": None, "billed": True}}

    @activity.defn(name=SHELL)
    async def shell(self, req: dict[str, Any]) -> dict[str, Any]:
        """One command in this worker's copy of the repository (`cwd` is relative to it)."""
        base = loops.root()
        try:  # the workflow checked the name; symlinks are this worker's to check
            workdir = confined_cwd(base, req.get("workdir", "."))
            cwd = confined_cwd(workdir, req["cwd"])
        except CwdOutsideWorkspace as exc:
            return {"cwd_error": str(exc)}
        seal, declared = str(req.get("seal") or ""), set(req.get("secrets") or ())
        # Every declared secret, not only those this command is given: an earlier command may
        # have written one to a file this one prints.
        secrets = sealed.values_for(declared)
        env = {**self.base_env(), "LOOPDSL_WORKDIR": str(workdir),
               **{k: sealed.unseal(v, seal, declared) for k, v in req["env"].items()}}
        argv = [sealed.unseal(a, seal, declared) for a in req["argv"]] if req.get("argv") is not None else None
        started: list[Any] = []
        async with _heartbeating(_beat_interval()):
            result = await run_command(script=req.get("script"), argv=argv, cwd=cwd, env=env,
                                       timeout=req.get("timeout"), marker=req.get("marker"),
                                       on_start=started.append)
        out = asdict(result)
        # What the command printed of a secret (given, or read from this worker) never reaches the history.
        out = sealed.redactor(secrets).redact_obj(out)
        out["command"] = started[0].to_json() if started else None
        out["host"] = loops.worker_host()
        return fitted(out, "command", cut=True)  # stdout and stderr, each within FIELD_LIMIT, cannot pass RESULT_LIMIT

    @activity.defn(name=TOOL)
    async def tool(self, req: dict[str, Any]) -> dict[str, Any]:
        """One call of an agent state's tool, in this worker's checkout (wf_tools.py)."""
        from ...language.agent_model import AgentAction, resolve_tool
        from ...language.compile import input_facts
        from ...runtime.tools.base import ToolOutcome
        from ...runtime.tools.registry import ToolEnv, factory_for

        loop = loops.loop_at(req["loop_path"], req.get("script"), req.get("files"), req["loop_file"])
        action = loop.states[req["state"]].action
        assert isinstance(action, AgentAction)
        listed = [(resolve_tool(loop.tools, use.name), use) for use in action.tools if use.name in req["tools"]]
        secrets = sealed.values_for(loop.secrets)
        env = ToolEnv(workdir=loops.root() / req.get("workdir", "."), env={**self.base_env(), **secrets},
                      secret_values=secrets, redact=sealed.redactor(secrets),
                      output_limit=action.tool_output_limit, action=action, worktree=loop.workspace.worktree,
                      inputs=req["inputs"], run=req["run"], facts=input_facts(loop))
        factory = factory_for(req["kind"], {})
        assert factory is not None
        async with _heartbeating(_beat_interval()):
            box = await factory([(tool, use) for tool, use in listed if tool is not None], env)
            try:
                outcome = await box.call(req["name"], req["args"], call_id=req["call_id"], timeout=req["timeout"])
            except Exception as exc:  # noqa: BLE001 - a tool's bug goes back to the model, as locally
                outcome = ToolOutcome.failure(f"{req['name']} failed: {type(exc).__name__}: {exc}")
            finally:
                await box.aclose()
        try:
            return fitted(asdict(outcome), f"tool {req['name']}", cut=True)
        except PayloadTooLarge as exc:  # many fields each within the limit: the model is told
            return asdict(ToolOutcome.failure(str(exc)))

    def all(self) -> list[Callable[..., Any]]:
        return [self.prepare, self.llm, self.shell, self.finish, self.tool, self.publish, self.git]
