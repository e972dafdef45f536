"""The typed model of a loop: frozen dataclasses built from schema-valid data.

Raw YAML mappings stop here. `build_loop` assumes its input already passed the
JSON Schema (schema.py); it never raises on schema-valid data. Every object keeps
the `path` of the YAML node it came from (e.g. ``("states", "draft", "llm")``) so
rules can point diagnostics at `Document.positions[path]`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Mapping, Union

from .state_graph import EXHAUST, FAIL, NEXT, ROUTE, TIME_OUT, LoopGraph

YamlPath = tuple[Union[str, int], ...]

STATE_KINDS = ("shell", "llm", "evaluate", "checkpoint", "set", "loop", "end")
END_STATUSES = ("completed", "failed", "escalated")
ERROR_KINDS = (
    "rate_limit", "server_error", "timeout", "connection", "auth", "context_window",
    "shell_exit", "gate", "parse", "no_transition", "budget",
)
DEFAULT_RETRY_ON = frozenset(ERROR_KINDS) - {"auth", "context_window", "no_transition", "budget"}
RESERVED_NAMES = frozenset(
    {"inputs", "secrets", "feedback", "run", "budget", "history", "item", "index", "error"}
)
BUILTIN_GATES = ("python_syntax", "no_secrets")
NAME_RE = re.compile(r"\A[a-z][a-z0-9_]*\Z")  # \Z: `$` would accept a final newline
LOOP_NAME_RE = re.compile(r"\A[a-z][a-z0-9-]*\Z")
# Named gates never appear inside templates, so they may use '-' as in DSL.md's example.
GATE_NAME_RE = re.compile(r"\A[a-z][a-z0-9_-]*\Z")
DEFAULT_CHOICES = ("approve", "reject")
# A template that is one secret passed whole: `{{ secrets.NAME }}` or `{{ secrets['NAME'] }}`.
WHOLE_SECRET_RE = re.compile(
    r"""\{\{-?\s*secrets\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*['"]([A-Za-z_][A-Za-z0-9_]*)['"]\s*\])\s*-?\}\}"""
)
DEFAULT_OUTPUT_CAP = 1024 * 1024

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float | None:
    """'30s', '5m', '1h30m', '250ms' or a number of seconds -> seconds; None if not a duration."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 else None


@dataclass(frozen=True)
class InputSpec:
    name: str
    type: Literal["string", "integer", "number", "boolean", "array", "object"] = "string"
    has_default: bool = False
    default: Any = None
    required: bool = True
    description: str = ""
    enum: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    path: YamlPath = ()


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    # (prompt tokens above which, input_per_mtok, output_per_mtok): from LiteLLM's table
    # (`input_cost_per_token_above_200k_tokens` ...); a whole call is billed at its tier.
    tiers: tuple[tuple[int, float, float], ...] = ()


@dataclass(frozen=True)
class ModelAlias:
    name: str
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    price: Price | None = None
    api_base: str | None = None
    api_key_env: str | None = None
    timeout: float | None = None
    fallbacks: tuple[str, ...] = ()
    # Other LiteLLM call parameters (top_p, seed, stop, ...), passed through as given.
    params: Mapping[str, Any] = field(default_factory=dict)
    path: YamlPath = ()


@dataclass(frozen=True)
class Budget:
    tokens: int | None = None
    cost_usd: float | None = None
    steps: int | None = None
    wall_time: float | None = None  # seconds

    @property
    def is_empty(self) -> bool:
        return self.tokens is None and self.cost_usd is None and self.steps is None and self.wall_time is None


@dataclass(frozen=True)
class Backoff:
    initial: float = 1.0
    factor: float = 2.0
    max: float = 60.0
    jitter: bool = True


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff: Backoff = field(default_factory=Backoff)
    on: frozenset[str] = DEFAULT_RETRY_ON


@dataclass(frozen=True)
class ShellSpec:
    """A command: `cmd` runs under bash, `argv` runs without a shell. Both are templates."""

    cmd: str | None = None
    argv: tuple[str, ...] | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    ok_exit: tuple[int, ...] = (0,)
    path: YamlPath = ()

    @property
    def secrets_passed(self) -> dict[str, str]:
        """Environment variable -> declared secret, for each `env` entry that is exactly
        `{{ secrets.NAME }}`. Only these secrets reach the command (docs/dsl.md, secrets)."""
        passed = {}
        for key, value in self.env.items():
            found = WHOLE_SECRET_RE.fullmatch(value) if isinstance(value, str) else None
            if found:
                passed[key] = found.group(1) or found.group(2)
        return passed


GateKind = Literal["shell", "expr", "json_schema", "builtin", "ref"]


@dataclass(frozen=True)
class Gate:
    kind: GateKind
    name: str | None = None
    shell: ShellSpec | None = None
    expr: str | None = None
    schema: Mapping[str, Any] | None = None
    builtin: str | None = None
    ref: str | None = None
    # For built-ins: a template naming what to check (default: the attempt's text/stdout).
    value: str | None = None
    timeout: float | None = None
    path: YamlPath = ()

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.kind == "ref":
            return str(self.ref)
        if self.kind == "builtin":
            return str(self.builtin)
        return self.kind


@dataclass(frozen=True)
class Transition:
    to: str
    when: str | None = None
    path: YamlPath = ()


@dataclass(frozen=True)
class LlmAction:
    model: str
    prompt: str
    system: str | None = None
    skill: str | None = None
    output: Literal["text", "json"] = "text"
    schema: Mapping[str, Any] | None = None
    max_tokens: int | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class EvaluateAction:
    model: str
    prompt: str
    criteria: tuple[str, ...] = ()
    system: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class CheckpointAction:
    message: str = "Continue?"
    choices: tuple[str, ...] = DEFAULT_CHOICES
    timeout: float | None = None


@dataclass(frozen=True)
class SetAction:
    # name -> expression (str) or literal (any other scalar / structure)
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoopAction:
    path: str
    with_: Mapping[str, Any] = field(default_factory=dict)
    for_each: str | None = None
    concurrency: int = 1
    tolerate_failures: int = 0


Action = Union[ShellSpec, LlmAction, EvaluateAction, CheckpointAction, SetAction, LoopAction, None]


@dataclass(frozen=True)
class State:
    name: str
    kind: Literal["shell", "llm", "evaluate", "checkpoint", "set", "loop", "end"]
    action: Action = None
    end: str | None = None  # for kind == "end": completed | failed | escalated
    output: Mapping[str, Any] = field(default_factory=dict)  # end-state outputs (templates)
    next: str | None = None
    transitions: tuple[Transition, ...] = ()
    gates_before: tuple[Gate, ...] = ()
    gates_after: tuple[Gate, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    on_failure: str | None = None
    timeout: float | None = None
    max_visits: int | None = None
    on_exhausted: str | None = None
    idempotent: bool = False
    on_timeout: str | None = None
    description: str = ""
    path: YamlPath = ()

    @property
    def is_end(self) -> bool:
        return self.kind == "end"

    def targets(self) -> list[tuple[str, str, YamlPath]]:
        """Every (trigger, destination, yaml path) edge out of this state."""
        edges: list[tuple[str, str, YamlPath]] = []
        if self.next:
            edges.append((NEXT, self.next, self.path + ("next",)))
        for i, t in enumerate(self.transitions):
            edges.append((ROUTE, t.to, self.path + ("transitions", i, "to")))
        if self.on_failure:
            edges.append((FAIL, self.on_failure, self.path + ("on_failure",)))
        if self.on_exhausted:
            edges.append((EXHAUST, self.on_exhausted, self.path + ("on_exhausted",)))
        if self.on_timeout:
            edges.append((TIME_OUT, self.on_timeout, self.path + ("on_timeout",)))
        return edges


@dataclass(frozen=True)
class Schedule:
    cron: str
    timezone: str = "UTC"


@dataclass(frozen=True)
class Workspace:
    worktree: bool = False
    base: str = "HEAD"


@dataclass(frozen=True)
class Import:
    path: str
    alias: str | None = None
    yaml_path: YamlPath = ()


@dataclass(frozen=True)
class Concurrency:
    group: str
    on_conflict: Literal["skip", "wait", "fail"] = "fail"


@dataclass(frozen=True)
class Loop:
    name: str
    start: str
    states: Mapping[str, State]
    version: int = 1
    description: str = ""
    schedule: Schedule | None = None
    inputs: Mapping[str, InputSpec] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    models: Mapping[str, ModelAlias] = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)
    workspace: Workspace = field(default_factory=Workspace)
    imports: tuple[Import, ...] = ()
    gates: Mapping[str, Gate] = field(default_factory=dict)
    unattended: bool = False
    concurrency: Concurrency | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)
    source: Path | None = None  # the loop file, when loaded from disk

    @property
    def base_dir(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    @cached_property
    def graph(self) -> LoopGraph:
        """The state graph, built once per loop (the loop is frozen, so it never goes stale)."""
        return LoopGraph(self)


# ---------------------------------------------------------------- building


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
    return RetryPolicy(max_attempts=int(raw.get("max_attempts", 1)), backoff=backoff, on=on)


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
    "fallbacks", "params", "description",
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
    )


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
        start=str(data["start"]),
        states={k: build_state(k, v) for k, v in data["states"].items()},
        unattended=bool(data.get("unattended", False)),
        concurrency=Concurrency(group=str(concurrency["group"]), on_conflict=concurrency.get("on_conflict", "fail"))
        if concurrency
        else None,
        outputs=dict(data.get("outputs") or {}),
        source=source,
    )
