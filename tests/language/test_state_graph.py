"""LoopGraph: the one home of a loop's edges and of every walk over them."""
from __future__ import annotations

from loopdsl.language.compile import machine_config
from loopdsl.language.model import build_loop


def loop(**states):
    return build_loop({"loopdsl": 1, "name": "g", "start": "a", "states": states})


# a -> b -> (c | a) ; b fails to d ; e is unreachable and loops on itself.
GRAPH = loop(
    a={"shell": "true", "next": "b"},
    b={"shell": "true", "transitions": [{"to": "c", "when": "b.ok"}, {"to": "a"}], "on_failure": "d"},
    c={"end": "completed"},
    d={"end": "failed"},
    e={"shell": "true", "next": "e"},
)


def test_the_graph_is_built_once_per_loop_and_feeds_the_machine():
    assert GRAPH.graph is GRAPH.graph
    assert [(e.trigger, e.source, e.dest, e.when) for e in GRAPH.graph.edges] == [
        ("next", "a", "b", None), ("route", "b", "c", "b.ok"), ("route", "b", "a", None),
        ("fail", "b", "d", None), ("next", "e", "e", None)]
    assert machine_config(GRAPH).transitions == tuple(
        (e.trigger, e.source, e.dest, e.when) for e in GRAPH.graph.edges)


def test_reachability_both_ways():
    graph = GRAPH.graph
    assert graph.reachable == {"a", "b", "c", "d"}
    assert graph.reachable_from("a", avoid={"b"}) == {"a"}
    assert graph.reached_from("c") == set()
    assert graph.reached_from("a") == {"a", "b", "c", "d"}
    assert graph.reaching({"c"}) == {"a", "b", "c"}
    assert graph.guarded_by("c", {"b"}) and not graph.guarded_by("c", {"d"})


def test_paths_cycles_and_dominators():
    graph = GRAPH.graph
    assert graph.shortest_path("a", "d") == ["a", "b", "d"]
    assert graph.shortest_path("a", "d", lambda edge: edge.trigger != "fail") is None
    assert graph.shortest_cycle("a", {"a", "b"}) == ["a", "b", "a"]
    assert graph.unbounded_cycles(set()) == [["a", "b"]]  # e's self-loop is unreachable
    assert graph.unbounded_cycles({"b"}) == []
    assert graph.cyclic == {"a", "b"}
    assert graph.dominators.dominates("b", "d") and not graph.dominators.dominates("c", "d")


def test_breadth_first_from_several_starts_lists_parents_before_children():
    order = GRAPH.graph.breadth_first(["d", "a"])
    assert list(order) == ["d", "a", "b", "c"]
    assert order == {"d": None, "a": None, "b": "a", "c": "b"}


def test_unknown_destinations_are_skipped_or_read_as_resolved():
    typo = loop(a={"shell": "true", "next": "bb"}, b={"end": "completed"})
    assert typo.graph.successors == {"a": [], "b": []}
    assert typo.graph.reachable == {"a"}
    assert typo.graph.reachable_reading(lambda dest: ["b"] if dest == "bb" else []) == {"a", "b"}
