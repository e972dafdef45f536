"""How big a model call's prompt can get, read from its templates (for `loopdsl cost`).

The worst case counts the template source, plus for every value the template inserts the
most the interpreter lets that value be (its cap), up to the render cap of the whole
prompt; the typical case counts the template source alone. Sizes are in bytes except for
model replies inserted into a prompt, whose bound is the replying call's `max_tokens`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jinja2 import Environment, nodes

from ..language.model import DEFAULT_OUTPUT_CAP, EvaluateAction, LlmAction, Loop

SMALL_VALUE_BYTES = 32  # numbers, booleans, verdicts, decisions, timestamps, model names
_SMALL_FIELDS = {"exit_code", "duration_s", "ok", "verdict", "decision", "by", "at", "usage", "cost_usd", "model",
                 "attempt", "visits", "id", "date", "status"}
_CONTEXT_SMALL = {"run", "budget", "index"}


@dataclass
class PromptSize:
    fixed_bytes: int  # the skill and the instructions loopdsl adds (not templates: never truncated)
    source_bytes: int  # the prompt and system templates as written
    inserted_bytes: int  # the caps of the values they insert (worst case)
    inserted_tokens: int  # model replies they insert, bounded by those calls' max_tokens
    templates: int  # 1 (prompt) or 2 (prompt and system): each is rendered to at most RENDER_CAP bytes
    at_render_cap: bool  # a `{% for %}` can repeat values: the template may reach the render cap

    def typical_tokens(self) -> int:
        return bytes_to_tokens(self.fixed_bytes + self.source_bytes)

    def worst_tokens(self, context_window: int | None) -> int:
        ceiling = bytes_to_tokens(self.fixed_bytes + RENDER_CAP * self.templates)
        if self.at_render_cap:
            tokens = ceiling
        else:
            rendered = min(self.source_bytes + self.inserted_bytes, RENDER_CAP * self.templates)
            tokens = min(bytes_to_tokens(self.fixed_bytes + rendered) + self.inserted_tokens, ceiling)
        # A longer prompt is refused by the provider (context_window: never retried, not billed).
        return min(tokens, context_window) if context_window else tokens


RENDER_CAP = DEFAULT_OUTPUT_CAP


def bytes_to_tokens(size: int) -> int:
    """The same conservative estimate as dry runs: one token per 3 UTF-8 bytes, rounded up."""
    return -(-max(size, 0) // 3)


def _value_cap(loop: Loop, root: str, attr: str | None) -> tuple[int, int]:
    """(bytes, tokens) the value `root.attr` can be at most."""
    if root in _CONTEXT_SMALL:
        return SMALL_VALUE_BYTES, 0
    if root == "inputs" and attr is not None and attr in loop.inputs:
        spec = loop.inputs[attr]
        if spec.enum:
            return max(len(json.dumps(v)) for v in spec.enum), 0
        if spec.type in ("integer", "number", "boolean"):
            return SMALL_VALUE_BYTES, 0
        return DEFAULT_OUTPUT_CAP, 0
    state = loop.states.get(root)
    if state is None:
        return DEFAULT_OUTPUT_CAP, 0  # feedback, history, error, secrets, item: the rendered-value cap
    if attr in _SMALL_FIELDS:
        return SMALL_VALUE_BYTES, 0
    action = state.action
    if isinstance(action, (LlmAction, EvaluateAction)) and attr in (None, "text", "json", "feedback"):
        alias = loop.models.get(action.model)
        max_tokens = action.max_tokens or (alias.max_tokens if alias else None)
        if max_tokens:
            return 0, int(max_tokens)
    if state.kind == "shell" and attr is None:
        return 2 * DEFAULT_OUTPUT_CAP, 0  # stdout and stderr
    return DEFAULT_OUTPUT_CAP, 0


def _walk(node: nodes.Node, loop: Loop, out: list[tuple[int, int]], flags: dict[str, bool]) -> None:
    if isinstance(node, nodes.For):
        flags["loop"] = True
    if isinstance(node, (nodes.Getattr, nodes.Getitem)) and isinstance(node.node, nodes.Name):
        attr: Any = node.attr if isinstance(node, nodes.Getattr) else (
            node.arg.value if isinstance(node.arg, nodes.Const) else None)
        out.append(_value_cap(loop, node.node.name, attr if isinstance(attr, str) else None))
        return
    if isinstance(node, nodes.Name) and node.ctx == "load":
        out.append(_value_cap(loop, node.name, None))
        return
    for child in node.iter_child_nodes():
        _walk(child, loop, out, flags)


def inserted(loop: Loop, source: str) -> tuple[int, int, bool]:
    """(bytes, tokens, at_render_cap) inserted into `source` at most."""
    try:
        tree = Environment().parse(source)
    except Exception:
        return 0, 0, True
    caps: list[tuple[int, int]] = []
    flags = {"loop": False}
    _walk(tree, loop, caps, flags)
    return sum(b for b, _ in caps), sum(t for _, t in caps), flags["loop"]


def prompt_size(loop: Loop, action: LlmAction | EvaluateAction, skill_text: str) -> PromptSize:
    from ..runtime.actions.llm import EVALUATOR_INSTRUCTIONS

    fixed = skill_text
    if isinstance(action, EvaluateAction):
        fixed += EVALUATOR_INSTRUCTIONS + "Criteria:\n" + "".join(f"- {c}\n" for c in action.criteria)
    elif action.output == "json":
        fixed += "Reply with JSON only."
        if action.schema is not None:
            fixed += " It must match this JSON Schema: " + json.dumps(action.schema, sort_keys=True)
    sources = [action.prompt] + ([action.system] if action.system else [])
    ins_bytes = ins_tokens = 0
    capped = False
    for source in sources:
        b, t, c = inserted(loop, source)
        ins_bytes, ins_tokens, capped = ins_bytes + b, ins_tokens + t, capped or c
    return PromptSize(len(fixed.encode("utf-8")), sum(len(s.encode("utf-8")) for s in sources),
                      ins_bytes, ins_tokens, len(sources), capped)
