"""Schema-valid plain data (dicts, lists, scalars) -> the typed model of model.py.

`build_loop` assumes its input already passed the JSON Schema (schema.py); it never raises
on schema-valid data. model.py re-exports these builders, so importing them from there keeps
working.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .publish_model import build_publish
from .model import (
    BUILTIN_GATES,
    DEFAULT_CHOICES,
    DEFAULT_RETRY_ON,
    STATE_KINDS,
    Action,
    Backoff,
    Budget,
    CheckpointAction,
    Concurrency,
    DEFAULT_NOTIFY_TIMEOUT_S,
    EvaluateAction,
    Gate,
    Import,
    InputSpec,
    LlmAction,
    Loop,
    LoopAction,
    ModelAlias,
    Notify,
    Price,
    RetryPolicy,
    Schedule,
    Trigger,
    SetAction,
    ShellSpec,
    State,
    Transition,
    Workspace,
    YamlPath,
    parse_duration,
)


def _tuple_str(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def _shell_spec(raw: Any, path: YamlPath) -> ShellSpec:
    if isinstance(raw, str):
        return ShellSpec(cmd=raw, path=path)
    raw = dict(raw)
    argv = raw.get("argv")
    return ShellSpec(
        cmd=raw.get("cmd"),
        argv=tuple(str(a) for a in argv) if argv is not None else None,
        cwd=raw.get("cwd"),
        env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        timeout=parse_duration(raw.get("timeout")),
        ok_exit=tuple(int(c) for c in raw.get("ok_exit", (0,))),
        path=path,
    )


def build_gate(raw: Any, path: YamlPath, name: str | None = None) -> Gate:
    if isinstance(raw, str):
        if raw in BUILTIN_GATES:
            return Gate(kind="builtin", builtin=raw, name=name, path=path)
        return Gate(kind="ref", ref=raw, name=name, path=path)
    raw = dict(raw)
    common: dict[str, Any] = {
        "name": raw.get("name", name),
        "timeout": parse_duration(raw.get("timeout")),
        "path": path,
    }
    if "shell" in raw:
        spec = _shell_spec(raw["shell"], path + ("shell",))
        return Gate(kind="shell", shell=spec, **common)
    if "expr" in raw:
        return Gate(kind="expr", expr=str(raw["expr"]), **common)
    if "json_schema" in raw:
        return Gate(kind="json_schema", schema=raw["json_schema"], **common)
    if "builtin" in raw:
        return Gate(kind="builtin", builtin=str(raw["builtin"]), value=raw.get("value"), **common)
    return Gate(kind="ref", ref=str(raw.get("ref")), **common)


def _retry(raw: Any) -> RetryPolicy:
    if not raw:
        return RetryPolicy()
    raw = dict(raw)
    b = dict(raw.get("backoff") or {})
    backoff = Backoff(
        initial=parse_duration(b.get("initial", 1.0)) or 0.0,
        factor=float(b.get("factor", 2.0)),
        max=parse_duration(b.get("max", 60.0)) or 0.0,
        jitter=bool(b.get("jitter", True)),
    )
    on = frozenset(raw["on"]) if "on" in raw else DEFAULT_RETRY_ON
    return RetryPolicy(max_attempts=int(raw.get("max_attempts", 1)), backoff=backoff, on=on,
                       reset_workspace=bool(raw.get("reset_workspace", False)))


def _action(kind: str, raw: Mapping[str, Any], path: YamlPath) -> Action:
    body = raw.get(kind)
    if kind == "shell":
        return _shell_spec(body, path + ("shell",))
    if kind == "llm":
        b = dict(body or {})
        schema = b.get("schema")
        return LlmAction(
            model=str(b["model"]),
            prompt=str(b.get("prompt", "")),
            system=b.get("system"),
            skill=b.get("skill"),
            output="json" if schema is not None else b.get("output", "text"),
            schema=schema,
            max_tokens=b.get("max_tokens"),
            temperature=b.get("temperature"),
        )
    if kind == "agent":
        from .agent_model import build_agent_action  # agent_model builds on model.py's types

        return build_agent_action(body, path + ("agent",))
    if kind == "evaluate":
        b = dict(body or {})
        return EvaluateAction(
            model=str(b["model"]),
            prompt=str(b.get("prompt", "")),
            criteria=_tuple_str(b.get("criteria")),
            system=b.get("system"),
            max_tokens=b.get("max_tokens"),
            temperature=b.get("temperature"),
        )
    if kind == "checkpoint":
        b = dict(body or {})
        return CheckpointAction(
            message=str(b.get("message", "Continue?")),
            choices=_tuple_str(b.get("choices")) or DEFAULT_CHOICES,
            timeout=parse_duration(b.get("timeout")),
        )
    if kind == "set":
        return SetAction(values=dict(body or {}))
    if kind == "loop":
        return LoopAction(
            path=str(body),
            with_=dict(raw.get("with") or {}),
            for_each=raw.get("for_each"),
            concurrency=int(raw.get("concurrency", 1)),
            tolerate_failures=int(raw.get("tolerate_failures", 0)),
        )
    return None


def build_state(name: str, raw: Mapping[str, Any]) -> State:
    path: YamlPath = ("states", name)
    kind = next((k for k in STATE_KINDS if k in raw), "end")
    gates = dict(raw.get("gates") or {})
    transitions = tuple(
        Transition(to=str(t["to"]), when=t.get("when"), path=path + ("transitions", i))
        for i, t in enumerate(raw.get("transitions") or ())
    )
    return State(
        name=name,
        kind=kind,  # type: ignore[arg-type]
        action=_action(kind, raw, path),
        end=raw.get("end") if kind == "end" else None,
        output=dict(raw.get("output") or {}),
        next=raw.get("next"),
        transitions=transitions,
        gates_before=tuple(
            build_gate(g, path + ("gates", "before", i)) for i, g in enumerate(gates.get("before") or ())
        ),
        gates_after=tuple(
            build_gate(g, path + ("gates", "after", i)) for i, g in enumerate(gates.get("after") or ())
        ),
        retry=_retry(raw.get("retry")),
        on_failure=raw.get("on_failure"),
        timeout=parse_duration(raw.get("timeout")),
        max_visits=raw.get("max_visits"),
        on_exhausted=raw.get("on_exhausted"),
        idempotent=bool(raw.get("idempotent", False)),
        on_timeout=raw.get("on_timeout"),
        description=str(raw.get("description", "")),
        path=path,
    )


def _input(name: str, raw: Any) -> InputSpec:
    raw = dict(raw or {})
    has_default = "default" in raw
    return InputSpec(
        name=name,
        type=raw.get("type", "string"),
        has_default=has_default,
        default=raw.get("default"),
        required=bool(raw.get("required", not has_default)),
        description=str(raw.get("description", "")),
        enum=tuple(raw["enum"]) if "enum" in raw else None,
        minimum=raw.get("minimum"),
        maximum=raw.get("maximum"),
        path=("inputs", name),
    )


_ALIAS_KEYS = {
    "model", "max_tokens", "temperature", "price", "api_base", "api_key_env", "timeout",
    "fallbacks", "params", "description", "cli_path", "cli_args",
}


def build_model_alias(name: str, raw: Any, path: YamlPath | None = None) -> ModelAlias:
    raw = dict(raw)
    price = raw.get("price")
    params = dict(raw.get("params") or {})
    # Known LiteLLM parameters given beside `model` pass through too (top_p, seed, stop ...).
    params.update({k: v for k, v in raw.items() if k not in _ALIAS_KEYS})
    return ModelAlias(
        name=name,
        model=str(raw["model"]),
        max_tokens=raw.get("max_tokens"),
        temperature=raw.get("temperature"),
        price=Price(float(price["input_per_mtok"]), float(price["output_per_mtok"])) if price else None,
        api_base=raw.get("api_base"),
        api_key_env=raw.get("api_key_env"),
        timeout=parse_duration(raw.get("timeout")),
        fallbacks=_tuple_str(raw.get("fallbacks")),
        params=params,
        path=path if path is not None else ("models", name),
        cli_path=raw.get("cli_path"),
        cli_args=_tuple_str(raw.get("cli_args")),
    )


def _tools(raw: Any) -> dict[str, Any]:
    from .agent_model import build_tools  # agent_model builds on model.py's types

    return build_tools(raw) if raw else {}


def _notify(raw: Any) -> tuple[Notify, ...]:
    out = []
    for i, item in enumerate(raw if isinstance(raw, list) else ()):
        if not isinstance(item, Mapping):
            continue
        on = item.get("on")
        timeout = parse_duration(item.get("timeout"))
        out.append(Notify(
            on=tuple(str(s) for s in on) if isinstance(on, list) else (),
            webhook=str(item["webhook"]) if item.get("webhook") is not None else None,
            secret=str(item["secret"]) if item.get("secret") is not None else None,
            format="slack" if item.get("format") == "slack" else "json",
            timeout=DEFAULT_NOTIFY_TIMEOUT_S if timeout is None else timeout,
            yaml_path=("notify", i),
        ))
    return tuple(out)


def _triggers(raw: Any) -> tuple[Trigger, ...]:
    out = []
    for event, item in (raw.items() if isinstance(raw, Mapping) else ()):
        if event not in ("ci_failure", "pull_request", "issues", "issue_comment") or not isinstance(item, Mapping):
            continue
        workflow = item.get("workflow")
        inputs = item.get("inputs")
        out.append(Trigger(
            event=event,
            workflows=(str(workflow),) if isinstance(workflow, str) else _tuple_str(workflow),
            types=_tuple_str(item.get("types")),
            branches=_tuple_str(item.get("branches")),
            command=str(item["command"]) if item.get("command") is not None else None,
            inputs={str(k): str(v) for k, v in inputs.items()} if isinstance(inputs, Mapping) else {},
            yaml_path=("on", event),
        ))
    return tuple(out)


def build_loop(data: Mapping[str, Any], source: Path | None = None) -> Loop:
    """Schema-valid plain data (dicts, lists, scalars) -> Loop."""
    budget = dict(data.get("budget") or {})
    schedule = data.get("schedule")
    workspace = dict(data.get("workspace") or {})
    concurrency = data.get("concurrency")
    imports = []
    for i, item in enumerate(data.get("imports") or ()):
        if isinstance(item, str):
            imports.append(Import(path=item, yaml_path=("imports", i)))
        else:
            imports.append(Import(path=str(item["path"]), alias=item.get("as"), yaml_path=("imports", i)))
    return Loop(
        version=int(data.get("loopdsl", 1)),
        name=str(data["name"]),
        description=str(data.get("description", "")),
        schedule=Schedule(cron=str(schedule["cron"]), timezone=str(schedule.get("timezone", "UTC")))
        if schedule
        else None,
        inputs={k: _input(k, v) for k, v in (data.get("inputs") or {}).items()},
        secrets=_tuple_str(data.get("secrets")),
        models={k: build_model_alias(k, v) for k, v in (data.get("models") or {}).items()},
        budget=Budget(
            tokens=budget.get("tokens"),
            cost_usd=float(budget["cost_usd"]) if "cost_usd" in budget else None,
            steps=budget.get("steps"),
            wall_time=parse_duration(budget.get("wall_time")),
        ),
        workspace=Workspace(worktree=bool(workspace.get("worktree", False)), base=str(workspace.get("base", "HEAD"))),
        imports=tuple(imports),
        gates={k: build_gate(v, ("gates", k), name=k) for k, v in (data.get("gates") or {}).items()},
        tools=_tools(data.get("tools")),
        start=str(data["start"]),
        states={k: build_state(k, v) for k, v in data["states"].items()},
        unattended=bool(data.get("unattended", False)),
        concurrency=Concurrency(group=str(concurrency["group"]), on_conflict=concurrency.get("on_conflict", "fail"))
        if concurrency
        else None,
        notify=_notify(data.get("notify")),
        publish=build_publish(data.get("publish")),
        on=_triggers(data.get("on")),
        outputs=dict(data.get("outputs") or {}),
        source=source,
    )
