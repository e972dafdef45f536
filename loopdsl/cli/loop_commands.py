"""`loopdsl graph` and `patterns`: draw a loop, list the loops installed packages ship."""
from __future__ import annotations

import click

from ..language.compile import machine_config
from ..language.diagram import to_dot, to_mermaid
from ..language.packaged_loops import installed_loops, resolve_loop_ref
from ..language.terminal_safe import visible
from ..lint.pipeline import load_loop


@click.command()
@click.argument("loop")
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid", show_default=True)
def graph(loop: str, fmt: str) -> None:
    """Print LOOP's state machine as Mermaid stateDiagram-v2 (or Graphviz dot)."""
    model = load_loop(resolve_loop_ref(loop))
    config = machine_config(model)
    click.echo(to_mermaid(model, config) if fmt == "mermaid" else to_dot(model, config), nl=False)


@click.command()
def patterns() -> None:
    """List loops shipped by installed packages (entry point group loopdsl.loops)."""
    found = installed_loops()
    if not found:
        click.echo("no loop packages installed (a package ships loops with an entry point in group 'loopdsl.loops')")
        return
    for item in found:
        click.echo(visible(f"pkg:{item.name:<28} {item.distribution} {item.version}"))  # names from installed files
