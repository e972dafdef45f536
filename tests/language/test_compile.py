"""compile: a pure function from the model to a transitions machine and an action table."""
from __future__ import annotations

import pytest

from loopdsl.language.compile import EXHAUST, FAIL, NEXT, ROUTE, compile_loop, machine_config
from loopdsl.language.diagram import to_dot, to_mermaid
from loopdsl.language.model import build_loop
from loopdsl.language.templates import Expression, TemplateError


def loop_data(**states):
    return {
        "loopdsl": 1,
        "name": "t",
        "start": "a",
        "states": states
        or {
            "a": {"set": {"x": "1 + 1", "lit": 3}, "next": "b"},
            "b": {
                "shell": "echo {{ a.x }}",
                "transitions": [{"to": "c", "when": "a.x > 5"}, {"to": "d"}],
                "on_failure": "d",
                "max_visits": 2,
                "on_exhausted": "d",
            },
            "c": {"end": "completed", "output": {"x": "{{ a.x }}"}},
            "d": {"end": "failed"},
        },
    }


class Box:
    state: str


def test_machine_config_lists_every_edge_in_priority_order():
    config = machine_config(build_loop(loop_data()))
    assert config.initial == "a"
    assert config.final == ("c", "d")
    assert config.transitions == (
        (NEXT, "a", "b", None),
        (ROUTE, "b", "c", "a.x > 5"),
        (ROUTE, "b", "d", None),
        (FAIL, "b", "d", None),
        (EXHAUST, "b", "d", None),
    )


def test_compiled_states_hold_compiled_templates_and_literals():
    compiled = compile_loop(build_loop(loop_data()))
    a = compiled.states["a"]
    assert isinstance(a.set_values["x"], Expression) and a.set_values["lit"] == 3
    assert a.set_values["x"]({}) == 2
    b = compiled.states["b"]
    assert b.shell is not None and b.shell.command is not None
    assert "LOOPDSL_1" in b.shell.command.script and "{{" not in b.shell.command.script
    # A value that is one {{ expr }} keeps its type: it compiles to an expression.
    assert isinstance(compiled.states["c"].output["x"], Expression)


@pytest.mark.parametrize("x, dest", [(9, "c"), (1, "d")])
def test_machine_dispatches_on_guards_first_true_wins(x, dest):
    compiled = compile_loop(build_loop(loop_data()))
    box = Box()
    compiled.new_machine(box, lambda expr, event: bool(expr(event.kwargs["ctx"])))
    box.trigger("next")  # type: ignore[attr-defined]
    assert box.state == "b"
    assert box.trigger("route", ctx={"a": {"x": x}}) is True  # type: ignore[attr-defined]
    assert box.state == dest


def test_no_matching_guard_leaves_the_machine_where_it_was():
    data = loop_data()
    data["states"]["b"]["transitions"] = [{"to": "c", "when": "a.x > 5"}]
    compiled = compile_loop(build_loop(data))
    box = Box()
    compiled.new_machine(box, lambda expr, event: bool(expr(event.kwargs["ctx"])))
    box.trigger("next")  # type: ignore[attr-defined]
    assert box.trigger("route", ctx={"a": {"x": 1}}) is False  # type: ignore[attr-defined]
    assert box.state == "b"


def _three_way(whens):
    """A loop whose state `b` routes to c0, c1, c2 in order, under the given `when`s."""
    data = loop_data()
    data["states"]["b"]["transitions"] = [
        {"to": f"c{i}", **({"when": when} if when is not None else {})} for i, when in enumerate(whens)
    ]
    for i in range(len(whens)):
        data["states"][f"c{i}"] = {"end": "completed"}
    return compile_loop(build_loop(data))


@pytest.mark.parametrize("whens", [
    ("a.x > 5", "a.x > 2", None),
    ("a.x == 1", "a.x == 3", "a.x == 7"),
    (None,),
    ("a.x % 2 == 0", "a.x > 0", "a.x < 100"),
])
@pytest.mark.parametrize("x", [0, 1, 3, 4, 7, 9])
def test_fire_dispatches_as_the_transitions_machine_does(whens, x):
    """The engine's dispatch (`fire`) and a `transitions` machine built from the same
    compiled loop agree on every trigger, guard outcome and order, no-match included."""
    compiled = _three_way(whens)
    box = Box()
    compiled.new_machine(box, lambda expr, event: bool(expr(event.kwargs["ctx"])))
    ctx = {"a": {"x": x}}
    assert compiled.fire("a", NEXT) == "b"
    box.trigger(NEXT)  # type: ignore[attr-defined]
    for trigger in (FAIL, EXHAUST):
        assert compiled.fire("b", trigger) == "d"
    moved = box.trigger(ROUTE, ctx=ctx)  # type: ignore[attr-defined]
    assert compiled.fire("b", ROUTE, ctx) == (box.state if moved else None)


def test_fire_passes_a_failing_guard_s_error_on():
    compiled = _three_way(("a.missing > 1", None))
    with pytest.raises(Exception) as raised:
        compiled.fire("b", ROUTE, {"a": {"x": 1}})
    box = Box()
    compiled.new_machine(box, lambda expr, event: bool(expr(event.kwargs["ctx"])))
    box.trigger(NEXT)  # type: ignore[attr-defined]
    with pytest.raises(type(raised.value)):
        box.trigger(ROUTE, ctx={"a": {"x": 1}})  # type: ignore[attr-defined]


def test_compile_rejects_a_placeholder_inside_single_quotes():
    data = loop_data()
    data["states"]["b"]["shell"] = "echo '{{ a.x }}'"
    with pytest.raises(TemplateError):
        compile_loop(build_loop(data))


def test_compile_is_deterministic():
    one = compile_loop(build_loop(loop_data()))
    two = compile_loop(build_loop(loop_data()))
    assert one.config == two.config


def test_mermaid_shows_guards_on_edges_and_ends():
    model = build_loop(loop_data())
    text = to_mermaid(model, machine_config(model))
    assert text.startswith("---") or "stateDiagram-v2" in text
    assert "stateDiagram-v2" in text
    assert "b --> c: route [a.x > 5]" in text
    assert "b --> d: route | fail | exhaust" in text  # transitions merges parallel edges
    assert "c --> [*]" in text and "d --> [*]" in text
    assert "[*] --> a" in text


def test_dot_output_is_a_digraph_with_labels():
    model = build_loop(loop_data())
    text = to_dot(model, machine_config(model))
    assert text.startswith('digraph "t" {')
    assert '"b" -> "c" [label="route [a.x > 5]"];' in text
    assert '"c" [shape=doublecircle];' in text


def test_graph_and_validate_never_import_litellm(tmp_path):
    """`graph` and `validate` are lint-speed commands: LiteLLM's import takes seconds."""
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "deterministic-multistep" / "loop.yaml"
    probe = (
        "import sys\n"
        "from loopdsl.cli import main\n"
        "sys.argv = ['loopdsl'] + sys.argv[1:]\n"
        "code = 0\ntry:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('LITELLM' if 'litellm' in sys.modules else 'CLEAN', code, file=sys.stderr)\n"
    )
    for args in (["graph", str(example)], ["validate", str(example)], ["run", str(example), "--dry-run"]):
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120)
        assert done.stderr.strip().endswith("CLEAN 0"), (args, done.stderr[-500:])
