"""A run's outputs, rendered when it ends."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..language.compile import CompiledState
from ..language.templates import Expression, RenderError
from .run_state import NotJsonValue, json_value

if TYPE_CHECKING:
    from .engine import Engine


def render_outputs(engine: "Engine", cs: CompiledState | None) -> tuple[dict[str, Any], list[str]]:
    """The run's outputs, and a message per output that could not be rendered (its value
    is then null): a `completed` end must not pass off a broken output as done."""
    outputs: dict[str, Any] = {}
    problems: list[str] = []
    ctx = engine._refresh_context(engine.run.current, 1)
    templates = dict(engine.compiled.outputs)
    if cs is not None:
        templates.update(cs.output)
    for name, template in templates.items():
        try:
            if isinstance(template, Expression):
                outputs[name] = json_value(template(ctx))
            elif hasattr(template, "render"):
                outputs[name] = template.render(ctx)
            else:
                outputs[name] = template
        except (RenderError, NotJsonValue) as exc:
            outputs[name] = None  # e.g. names a state this path never ran
            engine.emit("output_error", output=name, message=str(exc))
            problems.append(f"output '{name}': {exc}")
    return outputs, problems
