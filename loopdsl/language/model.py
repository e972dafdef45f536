"""The typed model of a loop: frozen dataclasses built from schema-valid data.

Raw YAML mappings stop here: model_build.py turns them into these classes (`build_loop`
and friends, also importable from this module). Every object keeps
the `path` of the YAML node it came from (e.g. ``("states", "draft", "llm")``) so
rules can point diagnostics at `Document.positions[path]`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Union

from .state_graph import EXHAUST, FAIL, NEXT, ROUTE, TIME_OUT, LoopGraph

YamlPath = tuple[Union[str, int], ...]

STATE_KINDS = ("shell", "llm", "agent", "evaluate", "checkpoint", "set", "loop", "end")
END_STATUSES = ("completed", "failed", "escalated")
ERROR_KINDS = (
    "rate_limit", "server_error", "timeout", "connection", "auth", "context_window",
    "shell_exit", "gate", "parse", "no_transition", "budget", "max_turns", "interrupted",
)
DEFAULT_RETRY_ON = frozenset(ERROR_KINDS) - {"auth", "context_window", "no_transition", "budget", "max_turns", "interrupted"}
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
    cli_path: str | None = None  # agent `cli:` states: the CLI binary and extra arguments
    cli_args: tuple[str, ...] = ()


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
    # An agent in a worktree: a new attempt restores the files the visit began with.
    reset_workspace: bool = False


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


Action = Union[ShellSpec, LlmAction, EvaluateAction, CheckpointAction, SetAction, LoopAction, Any, None]  # Any: agent_model.AgentAction


@dataclass(frozen=True)
class State:
    name: str
    kind: Literal["shell", "llm", "agent", "evaluate", "checkpoint", "set", "loop", "end"]
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


# The statuses a `notify:` entry may name: every status a run can reach but `running`.
NOTIFY_STATUSES = ("waiting", "completed", "failed", "escalated", "budget_exhausted", "aborted")
DEFAULT_NOTIFY_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Notify:
    """One `notify:` webhook: the URL is literal (`webhook`) or a declared secret's value (`secret`)."""

    on: tuple[str, ...]
    webhook: str | None = None
    secret: str | None = None
    format: Literal["json", "slack"] = "json"
    timeout: float = DEFAULT_NOTIFY_TIMEOUT_S
    yaml_path: YamlPath = ()


@dataclass(frozen=True)
class Trigger:
    """One `on:` entry: a GitHub event that starts the loop, and payload paths for its inputs."""

    event: Literal["ci_failure", "pull_request", "issues", "issue_comment"]
    workflows: tuple[str, ...] = ()  # ci_failure: the watched workflows' names
    types: tuple[str, ...] = ()  # pull_request, issues: the activities (empty: GitHub's default)
    branches: tuple[str, ...] = ()
    command: str | None = None  # issue_comment: the word a comment starts with
    inputs: Mapping[str, str] = field(default_factory=dict)  # input name -> `event.` path
    yaml_path: YamlPath = ()


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
    tools: Mapping[str, Any] = field(default_factory=dict)  # name -> agent_model.ToolDef
    unattended: bool = False
    concurrency: Concurrency | None = None
    notify: tuple[Notify, ...] = ()
    publish: Any = None  # publish_model.Publish: the GitHub writes after a `completed` end
    on: tuple[Trigger, ...] = ()
    outputs: Mapping[str, Any] = field(default_factory=dict)
    source: Path | None = None  # the loop file, when loaded from disk

    @property
    def base_dir(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    @cached_property
    def graph(self) -> LoopGraph:
        """The state graph, built once per loop (the loop is frozen, so it never goes stale)."""
        return LoopGraph(self)


# The builders live in model_build.py, which imports the classes above: they are looked up
# on first use, so `from loopdsl.language.model import build_loop` keeps working without an
# import cycle.
_BUILDERS = ("build_gate", "build_loop", "build_model_alias", "build_state")

if TYPE_CHECKING:
    from .model_build import build_gate, build_loop, build_model_alias, build_state


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        from . import model_build

        return getattr(model_build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
