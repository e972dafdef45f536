"""One home for a loop's state graph: its edges by trigger and every walk over them.

`LoopGraph` derives the edges once (from `State.targets()`, in firing order) and answers
what lint, audit, cost, dry-run and compile ask: successors and predecessors, reachability,
breadth-first parents and shortest paths, strongly connected components and dominators.
A loop builds its graph once (`Loop.graph`); every user reads that one.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

from .dominators import DominatorTree

if TYPE_CHECKING:
    from .model import Loop, State, YamlPath


# Triggers, one per kind of edge (State.targets() lists them; the machine fires them).
NEXT, ROUTE, FAIL, EXHAUST, TIME_OUT = "next", "route", "fail", "exhaust", "time_out"


class Edge(NamedTuple):
    trigger: str  # one of the triggers above
    source: str
    dest: str
    when: str | None  # a `transitions` entry's condition (route edges only)
    path: YamlPath  # where the destination is written


class LoopGraph:
    def __init__(self, loop: Loop):
        self.loop = loop
        self.out: dict[str, list[Edge]] = {name: _edges_out(state) for name, state in loop.states.items()}

    @cached_property
    def edges(self) -> tuple[Edge, ...]:
        """Every edge, state by state, in the order the machine tries them."""
        return tuple(edge for edges in self.out.values() for edge in edges)

    @cached_property
    def successors(self) -> dict[str, list[str]]:
        """Destinations of each state over every edge kind, known states only."""
        states = self.loop.states
        return {name: [e.dest for e in edges if e.dest in states] for name, edges in self.out.items()}

    @cached_property
    def predecessors(self) -> dict[str, list[str]]:
        """Sources of edges into each state, each source once."""
        preds: dict[str, list[str]] = {name: [] for name in self.loop.states}
        for name, dests in self.successors.items():
            for dest in dests:
                if name not in preds[dest]:
                    preds[dest].append(name)
        return preds

    @cached_property
    def reachable(self) -> set[str]:
        """States some path from the start reaches (the start included)."""
        return self.reachable_from(self.loop.start)

    def reachable_from(self, start: str, avoid: Iterable[str] = ()) -> set[str]:
        """States reachable from `start` (itself included) without entering `avoid`."""
        blocked = set(avoid)
        if start in blocked or start not in self.loop.states:
            return set()
        return set(self.breadth_first((start,), lambda edge: edge.dest not in blocked))

    def reachable_reading(self, resolve: Callable[[str], Iterable[str]]) -> set[str]:
        """States reachable from the start when each unknown destination is read as the
        states `resolve` gives for it (lint reads a misspelt name as its did-you-mean)."""
        states = self.loop.states
        seen: set[str] = set()
        stack = [self.loop.start]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            for edge in self.out.get(name, ()):
                stack.extend([edge.dest] if edge.dest in states else resolve(edge.dest))
        return seen

    def reached_from(self, source: str) -> set[str]:
        """States some path from `source` leads to in one step at least (memoised)."""
        cache: dict[str, set[str]] = self.__dict__.setdefault("_reached_from", {})
        if source not in cache:
            seen: set[str] = set()
            for first in self.successors.get(source, ()):
                if first not in seen:
                    seen |= self.reachable_from(first)
            cache[source] = seen
        return cache[source]

    def reaching(self, goals: Iterable[str]) -> set[str]:
        """`goals` and every state from which some path leads to one of them."""
        found = set(goals)
        frontier = list(found)
        while frontier:
            for pred in self.predecessors.get(frontier.pop(), ()):
                if pred not in found:
                    found.add(pred)
                    frontier.append(pred)
        return found

    def breadth_first(self, starts: Sequence[str], follow: Callable[[Edge], bool] | None = None) -> dict[str, str | None]:
        """Each state reached from `starts` over known edges `follow` accepts, mapped to its
        breadth-first parent (None for a start), in the order the search reaches them."""
        parent: dict[str, str | None] = dict.fromkeys(starts)
        queue = deque(parent)
        while queue:
            name = queue.popleft()
            for edge in self.out.get(name, ()):
                if edge.dest in self.loop.states and edge.dest not in parent and (follow is None or follow(edge)):
                    parent[edge.dest] = name
                    queue.append(edge.dest)
        return parent

    def shortest_path(self, start: str, target: str, follow: Callable[[Edge], bool] | None = None) -> list[str] | None:
        """A fewest-edges path start..target over edges `follow` accepts, or None."""
        parent = self.breadth_first((start,), follow)
        return _path_to(parent, target) if target in parent else None

    def shortest_cycle(self, start: str, members: set[str]) -> list[str]:
        """A fewest-edges cycle from `start` back to itself inside `members` ([start, start]
        when there is none)."""
        parent = self.breadth_first((start,), lambda edge: edge.dest in members)
        for node in parent:
            if start in self.successors[node]:
                return _path_to(parent, node) + [start]
        return [start, start]

    def components(self, nodes: Iterable[str]) -> tuple[list[list[str]], dict[str, list[str]]]:
        """Strongly connected components of the subgraph on `nodes` (in Tarjan's order) and
        that subgraph's edges."""
        order = list(nodes)
        kept = set(order)
        sub_edges = {n: [d for d in self.successors[n] if d in kept] for n in order}
        return strongly_connected(order, sub_edges), sub_edges

    def cycles_within(self, nodes: Iterable[str]) -> list[list[str]]:
        """The components of the subgraph on `nodes` that contain a cycle, in Tarjan's order."""
        components, sub_edges = self.components(nodes)
        return [c for c in components if len(c) > 1 or c[0] in sub_edges[c[0]]]

    def unbounded_cycles(self, bounded: set[str]) -> list[list[str]]:
        """Reachable cycles through no state in `bounded`: one list of states per strongly
        connected component, states and components in the loop's order."""
        live = self.reachable - bounded
        position = {name: i for i, name in enumerate(self.loop.states)}
        found = [sorted(c, key=position.__getitem__)
                 for c in self.cycles_within(n for n in self.loop.states if n in live)]
        return sorted(found, key=lambda component: position[component[0]])

    @cached_property
    def cyclic(self) -> frozenset[str]:
        """Reachable states that lie on some cycle."""
        return frozenset(name for component in self.unbounded_cycles(set()) for name in component)

    def guarded_by(self, target: str, guards: set[str]) -> bool:
        """Whether every path from the start to `target` passes through a state in `guards`."""
        return target in guards or target not in self.reachable_from(self.loop.start, avoid=guards)

    @cached_property
    def dominators(self) -> DominatorTree:
        """Which states every path from the start to a state passes through."""
        return DominatorTree(self.loop.start, self.successors)


def _edges_out(state: State) -> list[Edge]:
    whens = iter(t.when for t in state.transitions)
    return [Edge(trigger, state.name, dest, next(whens) if trigger == ROUTE else None, path)
            for trigger, dest, path in state.targets()]


def _path_to(parent: Mapping[str, str | None], target: str) -> list[str]:
    path = [target]
    while (up := parent[path[-1]]) is not None:
        path.append(up)
    return list(reversed(path))


def strongly_connected(nodes: list[str], edges: Mapping[str, list[str]]) -> list[list[str]]:
    """Tarjan's SCCs (iterative), components in no particular order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    node_set = set(nodes)
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in node_set:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(component)
    return out
