"""The typed model of v1.1's agents: named `tools:` and the `agent` state's action.

Built from schema-valid data like the rest of model.py (which only dispatches here), so
a loop that passed the schema always builds. Every object keeps its YAML `path` for lint.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

from .model import ShellSpec, YamlPath, parse_duration
from .model_build import _shell_spec

TOOL_NAME_RE = re.compile(r"\A[a-z][a-z0-9_]{0,63}\Z")
# Reserved: the built-in workspace tools (runtime/tools/workspace.py) and `args`, the name
# under which a tool's templates see their arguments.
READING_BUILTINS = ("read_file", "list_files", "search_files")
WRITING_BUILTINS = ("write_file", "edit_file")
BUILTIN_TOOLS = READING_BUILTINS + WRITING_BUILTINS
RESERVED_TOOL_NAMES = frozenset(BUILTIN_TOOLS) | {"args"}
DEFAULT_MAX_TOOL_CALLS = 100
DEFAULT_MAX_TOOL_CALLS_PER_TURN = 16
DEFAULT_TOOL_OUTPUT_LIMIT = 16 * 1024
DEFAULT_TOOL_TIMEOUT_S = 120.0
DEFAULT_MCP_STARTUP_S = 30.0
TOOL_CHOICES = ("auto", "required", "none")

ToolKind = Literal["shell", "mcp", "loop", "builtin"]


@dataclass(frozen=True)
class McpAllow:
    name: str  # the server's name for the tool
    as_: str | None = None  # offered under this name instead of `<entry>__<name>`

    @classmethod
    def parse(cls, raw: Any) -> McpAllow:
        """One `allow:` item: a tool name, or `{name, as}`."""
        if isinstance(raw, McpAllow):
            return raw
        if isinstance(raw, Mapping):
            return cls(name=str(raw["name"]), as_=raw.get("as"))
        return cls(name=str(raw))

    def offered_as(self, entry: str) -> str:
        """The name the model sees for this tool of MCP entry `entry`."""
        return self.as_ or f"{entry}__{self.name}"


@dataclass(frozen=True)
class McpServer:
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout: float = DEFAULT_MCP_STARTUP_S
    # Declared size of the allowed tools' definitions: what dry runs and `cost` count for
    # them, since those never start the server to list them.
    schema_tokens: int = 0


@dataclass(frozen=True)
class ToolDef:
    """One entry under `tools:` (or a built-in, with kind "builtin" and no body)."""

    name: str
    kind: ToolKind
    description: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)  # name -> JSON Schema of the argument
    required: tuple[str, ...] = ()
    shell: ShellSpec | None = None
    mcp: McpServer | None = None
    allow: tuple[McpAllow, ...] = ()
    loop: str | None = None
    timeout: float = DEFAULT_TOOL_TIMEOUT_S
    idempotent: bool = False
    secrets: tuple[str, ...] = ()
    approve: bool = False
    path: YamlPath = ()

    @property
    def writes(self) -> bool:
        return self.name in WRITING_BUILTINS and self.kind == "builtin"

    def offered_names(self) -> list[str]:
        """The names the model is offered this tool under: an MCP entry's allowed tools, or its own."""
        return [allowed.offered_as(self.name) for allowed in self.allow] if self.kind == "mcp" else [self.name]

    def parameters_schema(self) -> dict[str, Any]:
        """The arguments' JSON Schema as the model is offered it: an object of `params`,
        nothing else accepted (extra arguments are refused)."""
        schema: dict[str, Any] = {"type": "object", "properties": {k: v for k, v in self.params.items()},
                                  "additionalProperties": False}
        if self.required:
            schema["required"] = list(self.required)
        return schema


@dataclass(frozen=True)
class ToolUse:
    """An agent's listing of a tool, possibly narrowed."""

    name: str
    approve: bool = False
    paths: tuple[str, ...] = ()  # built-ins: globs the tool may touch
    with_: Mapping[str, Any] = field(default_factory=dict)  # fixed arguments
    path: YamlPath = ()


@dataclass(frozen=True)
class AgentAction:
    prompt: str
    model: str = ""  # empty only with `cli`
    system: str | None = None
    skill: str | None = None
    tools: tuple[ToolUse, ...] = ()
    max_turns: int | None = None  # required (lint); None here so lint can say so
    output: Literal["text", "json"] = "text"
    schema: Mapping[str, Any] | bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    tool_choice: str = "auto"
    parallel_tool_calls: bool | None = None
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    max_tool_calls_per_turn: int = DEFAULT_MAX_TOOL_CALLS_PER_TURN
    tool_output_limit: int = DEFAULT_TOOL_OUTPUT_LIMIT
    writable: tuple[str, ...] = ()
    read_ignored: bool = False
    cli: str | None = None
    max_cost_usd: float | None = None
    permissions: Literal["read", "edit", "full"] = "read"
    unsafe: bool = False
    path: YamlPath = ()


def _str_tuple(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value or ())


def build_tool(name: str, raw: Mapping[str, Any], path: YamlPath | None = None) -> ToolDef:
    path = path if path is not None else ("tools", name)
    raw = dict(raw)
    mcp = raw.get("mcp")
    kind: ToolKind = "shell" if "shell" in raw else "mcp" if mcp is not None else "loop"
    return ToolDef(
        name=name,
        kind=kind,
        description=str(raw.get("description", "")),
        params=dict(raw.get("params") or {}),
        required=_str_tuple(raw.get("required")),
        shell=_shell_spec(raw["shell"], path + ("shell",)) if "shell" in raw else None,
        mcp=McpServer(command=_str_tuple(mcp.get("command")),
                      env={str(k): str(v) for k, v in (mcp.get("env") or {}).items()},
                      startup_timeout=parse_duration(mcp.get("startup_timeout")) or DEFAULT_MCP_STARTUP_S,
                      schema_tokens=int(mcp.get("schema_tokens") or 0))
        if isinstance(mcp, Mapping) else None,
        allow=tuple(McpAllow.parse(a) for a in raw.get("allow") or ()),
        loop=str(raw["loop"]) if "loop" in raw else None,
        timeout=parse_duration(raw.get("timeout")) or DEFAULT_TOOL_TIMEOUT_S,
        idempotent=bool(raw.get("idempotent", False)),
        secrets=_str_tuple(raw.get("secrets")),
        approve=bool(raw.get("approve", False)),
        path=path,
    )


def build_tools(raw: Any) -> dict[str, ToolDef]:
    return {str(k): build_tool(str(k), v) for k, v in (raw or {}).items() if isinstance(v, Mapping)}


def _tool_use(raw: Any, path: YamlPath) -> ToolUse:
    if isinstance(raw, Mapping):
        return ToolUse(name=str(raw["name"]), approve=bool(raw.get("approve", False)),
                       paths=_str_tuple(raw.get("paths")), with_=dict(raw.get("with") or {}), path=path)
    return ToolUse(name=str(raw), path=path)


def build_agent_action(body: Any, path: YamlPath) -> AgentAction:
    b = dict(body or {})
    schema = b.get("schema")
    tools_path = path + ("tools",)
    return AgentAction(
        prompt=str(b.get("prompt", "")),
        model=str(b.get("model", "")),
        system=b.get("system"),
        skill=b.get("skill"),
        tools=tuple(_tool_use(t, tools_path + (i,)) for i, t in enumerate(b.get("tools") or ())),
        max_turns=b.get("max_turns"),
        output="json" if schema is not None else b.get("output", "text"),
        schema=schema,
        max_tokens=b.get("max_tokens"),
        temperature=b.get("temperature"),
        tool_choice=str(b.get("tool_choice", "auto")),
        parallel_tool_calls=b.get("parallel_tool_calls"),
        max_tool_calls=int(b.get("max_tool_calls", DEFAULT_MAX_TOOL_CALLS)),
        max_tool_calls_per_turn=int(b.get("max_tool_calls_per_turn", DEFAULT_MAX_TOOL_CALLS_PER_TURN)),
        tool_output_limit=int(b.get("tool_output_limit", DEFAULT_TOOL_OUTPUT_LIMIT)),
        writable=_str_tuple(b.get("writable")),
        read_ignored=bool(b.get("read_ignored", False)),
        cli=b.get("cli"),
        max_cost_usd=float(b["max_cost_usd"]) if "max_cost_usd" in b else None,
        permissions=b.get("permissions", "read"),
        unsafe=bool(b.get("unsafe", False)),
        path=path,
    )


def builtin_tool(name: str) -> ToolDef:
    return ToolDef(name=name, kind="builtin", idempotent=True)


def resolve_tool(tools: Mapping[str, ToolDef], name: str) -> ToolDef | None:
    """The definition a listed name refers to: a loop's own tool shadows nothing (lint
    reports a shadowing name), so a built-in name always means the built-in; an MCP
    tool's offered name means its entry narrowed to that tool (DSL.md: "one MCP tool")."""
    if name in BUILTIN_TOOLS:
        return builtin_tool(name)
    if name in tools:
        return tools[name]
    # One tool of an MCP entry, by the name it is offered as (`<entry>__<tool>` or its `as`):
    # the entry narrowed to that one tool.
    for tool in tools.values():
        if tool.kind == "mcp":
            for allowed in tool.allow:
                if allowed.offered_as(tool.name) == name:
                    return replace(tool, allow=(allowed,))
    return None

