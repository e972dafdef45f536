"""`loopdsl graph`: draw the compiled machine as Mermaid or Graphviz dot text.

Mermaid comes from transitions' own GraphMachine (mermaid engine, guards shown on
edges); its styling lines, which only mark the "active" state of a live machine, are
dropped since a loop file has none. End states get an edge to [*].
"""
from __future__ import annotations

from .compile import MachineConfig
from .model import Loop

_STYLE_PREFIXES = ("classDef ", "Class ", "class ")


def _edge_label(trigger: str, when: str | None) -> str:
    return f"{trigger} [{when}]" if when else trigger


def to_mermaid(loop: Loop, config: MachineConfig) -> str:
    from transitions.extensions.diagrams import GraphMachine

    class _Model:
        pass

    model = _Model()
    # Every transition is given to the constructor, before the model is added: added one by
    # one to a machine with a model, each redraws the whole graph (3,000 states took a minute).
    # Guards are shown by their source text; the graph machine never evaluates them.
    GraphMachine(
        model=model,
        states=list(config.states),
        transitions=[{"trigger": trigger, "source": source, "dest": dest, "conditions": [when] if when else []}
                     for trigger, source, dest, when in config.transitions],
        initial=config.initial,
        auto_transitions=False,
        graph_engine="mermaid",
        show_conditions=True,
        title=loop.name,
    )
    text = model.get_graph().draw(None)  # type: ignore[attr-defined]
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith(_STYLE_PREFIXES)]
    lines.extend(f"  {name} --> [*]" for name in config.final)
    return "\n".join(ln for ln in lines if ln.strip()) + "\n"


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(loop: Loop, config: MachineConfig) -> str:
    out = [f"digraph {_dot_quote(loop.name)} {{", "  rankdir=LR;", '  __start [shape=point];']
    for name in config.states:
        shape = "doublecircle" if name in config.final else "box"
        out.append(f"  {_dot_quote(name)} [shape={shape}];")
    out.append(f"  __start -> {_dot_quote(config.initial)};")
    for trigger, source, dest, when in config.transitions:
        out.append(f"  {_dot_quote(source)} -> {_dot_quote(dest)} [label={_dot_quote(_edge_label(trigger, when))}];")
    out.append("}")
    return "\n".join(out) + "\n"
