"""Questions about a loop's state graph that the audit and the cost estimate ask."""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .model import Loop
from collections.abc import Iterator, Mapping


def successors(loop: Loop, name: str) -> list[str]:
    return [dest for _trigger, dest, _path in loop.states[name].targets() if dest in loop.states]


def reachable(loop: Loop, start: str | None = None, avoid: Iterable[str] = ()) -> set[str]:
    """States reachable from `start` (default: the loop's start) without entering `avoid`."""
    blocked = set(avoid)
    first = start or loop.start
    if first in blocked or first not in loop.states:
        return set()
    seen = {first}
    queue = deque([first])
    while queue:
        for nxt in successors(loop, queue.popleft()):
            if nxt not in seen and nxt not in blocked:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def unbounded_cycles(loop: Loop, bounded: set[str]) -> list[list[str]]:
    """Cycles that pass through no state in `bounded` (reachable ones), as state lists.

    A cycle avoids every bounded state exactly when it lies inside the graph left after
    removing them, so the strongly connected components of that graph (the same Tarjan
    lint uses) that contain a cycle are the answer: one list of states per component.
    """
    from .state_graph import strongly_connected

    live = reachable(loop) - bounded
    order = [name for name in loop.states if name in live]
    edges = {name: [n for n in successors(loop, name) if n in live] for name in order}
    position = {name: i for i, name in enumerate(loop.states)}
    found = [sorted(component, key=position.__getitem__)
             for component in strongly_connected(order, edges)
             if len(component) > 1 or component[0] in edges[component[0]]]
    return sorted(found, key=lambda component: position[component[0]])


def in_cycle(loop: Loop, name: str) -> bool:
    return any(name in component for component in unbounded_cycles(loop, set()))


def guarded_by(loop: Loop, target: str, guards: set[str]) -> bool:
    """Whether every path from the start to `target` passes through a state in `guards`."""
    if target in guards:
        return True
    return target not in reachable(loop, avoid=guards)


def predecessors(loop: Loop, target: str) -> list[tuple[str, str, bool]]:
    """(source, trigger, conditional) for each edge into `target`; `conditional` when the edge
    belongs to a `transitions` list in which some entry has a `when`."""
    out = []
    for name, state in loop.states.items():
        has_guard = any(t.when for t in state.transitions)
        for trigger, dest, _path in state.targets():
            if dest == target:
                out.append((name, trigger, trigger == "route" and has_guard))
    return out


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
