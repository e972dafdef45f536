"""Before a real run: does every model the run may call have its credentials?

Without this check a missing API key showed up only at the first model call, after the
worktree was made and the shell states had run, and (for OpenAI, whose client reports it
as an HTTP 500) was retried before the run ended `escalated`. Here every model a run can
reach (each alias of a reachable `llm`/`evaluate` state, its fallbacks, and the same in
its sub-loops) is checked with LiteLLM's own `validate_environment` before the first
state runs, and a missing key stops the run with exit 2 and the variable to set.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..language.model import EvaluateAction, LlmAction, Loop, ModelAlias
from ..lint.loop_tree import loop_tree
from ..runtime.redaction import CREDENTIAL_NAME

# Providers whose clients also find credentials outside the environment (AWS profiles and
# instance roles): a missing variable there does not mean a missing credential.
_AMBIENT_CREDENTIAL_PROVIDERS = ("bedrock", "sagemaker")


@dataclass(frozen=True)
class ModelCall:
    loop: str
    source: Path | None  # the file of that loop
    alias: ModelAlias
    model: str
    primary: bool  # the alias's own model (its api_base, api_key_env and params apply), not a fallback


@dataclass(frozen=True)
class MissingCredential:
    call: ModelCall
    variables: tuple[str, ...]


def model_calls(loop: Loop) -> list[ModelCall]:
    """Each (alias, model) that a reachable model state of `loop` or of its sub-loops may call, once."""
    calls: dict[tuple[str, str, str], ModelCall] = {}
    for member in loop_tree(loop):
        live = member.graph.reachable
        for name, state in member.states.items():
            action = state.action
            if name not in live or not isinstance(action, (LlmAction, EvaluateAction)):
                continue
            alias = member.models.get(action.model)
            if alias is None:
                continue
            for index, model in enumerate((alias.model, *alias.fallbacks)):
                calls.setdefault((member.name, alias.name, model),
                                 ModelCall(member.name, member.source, alias, model, index == 0))
    return list(calls.values())


def _needs_litellm_check(call: ModelCall) -> bool:
    if call.model.split("/", 1)[0] in _AMBIENT_CREDENTIAL_PROVIDERS:
        return False
    if not call.primary:
        return True  # fallbacks are called without the alias's api_base and key (see llmcall)
    alias = call.alias
    if alias.api_key_env or alias.api_base:
        return False  # the key comes from api_key_env (checked directly), or a local server takes any
    return not any(CREDENTIAL_NAME.search(str(key)) for key in alias.params)


def missing_credentials(calls: list[ModelCall], litellm: Any | None) -> list[MissingCredential]:
    """The calls whose credentials are not set; `litellm` may be None when no call needs it."""
    missing: list[MissingCredential] = []
    for call in calls:
        if call.primary and call.alias.api_key_env:
            if not os.environ.get(call.alias.api_key_env):
                missing.append(MissingCredential(call, (call.alias.api_key_env,)))
            continue
        if not _needs_litellm_check(call) or litellm is None:
            continue
        with _without_empty_credentials():
            found = litellm.validate_environment(model=call.model)
        variables = tuple(str(v) for v in found.get("missing_keys") or ())
        if any(CREDENTIAL_NAME.search(v) for v in variables):  # a missing api_base alone has defaults
            missing.append(MissingCredential(call, variables))
    return missing


@contextmanager
def _without_empty_credentials() -> Iterator[None]:
    """LiteLLM's check counts a variable set to "" as present; the provider then refuses the
    key, and the run (already recorded) fails on its first call. Unset while it looks."""
    empty = {name: value for name, value in os.environ.items() if not value.strip() and CREDENTIAL_NAME.search(name)}
    for name in empty:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(empty)


def _where(call: ModelCall) -> str:
    """`file:line:col: ` of the alias in its loop's file, or just `file: ` (e.g. an imported alias)."""
    if call.source is None:
        return ""
    from ..language.loader import load_document

    doc, _ = load_document(call.source)
    position = doc.positions.get(tuple(call.alias.path)) if doc is not None else None
    return f"{call.source}:{position[0]}:{position[1]}: " if position else f"{call.source}: "


def describe(loop: Loop, missing: list[MissingCredential]) -> tuple[str, str]:
    """(message, hint) naming each model, where its alias is, and the variables it needs."""
    lines = []
    for m in missing:
        what = [m.call.model] + ([] if m.call.primary else ["a fallback"])
        what += [] if m.call.loop == loop.name else [f"in sub-loop {m.call.loop}"]
        lines.append(f"{_where(m.call)}model '{m.call.alias.name}' ({', '.join(what)}) needs "
                     f"{' and '.join(m.variables)}")
    variables = sorted({v for m in missing for v in m.variables if CREDENTIAL_NAME.search(v)})
    message = f"loop '{loop.name}' cannot call its models, nothing was run:\n  " + "\n  ".join(lines)
    hint = (f"set {', '.join(variables)} in the environment (e.g. `export {variables[0]}=...`), "
            "or run offline with `--script FILE`")
    return message, hint


async def check_credentials(loop: Loop, on_wait: Callable[[], None] = lambda: None) -> None:
    """Raise UsageError (exit 2) naming the missing variables; waits for LiteLLM only if a model needs it."""
    from .runs import UsageError
    from ..adapters.litellm_loading import is_loaded, start_loading, wait_until_loaded

    calls = model_calls(loop)
    if not calls:
        return
    start_loading()  # if not started yet: it then overlaps the worktree and the first shell states
    litellm = None
    if any(_needs_litellm_check(call) for call in calls):
        if not is_loaded():
            on_wait()
        litellm = await wait_until_loaded()
    missing = missing_credentials(calls, litellm)
    if missing:
        raise UsageError(*describe(loop, missing))
