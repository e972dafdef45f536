"""Questions about a loop's state graph that the audit and the cost estimate ask."""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ..model import Loop


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
    removing them, so the strongly connected components of that graph (Tarjan) that
    contain a cycle are the answer: one representative list of states per component.
    """
    live = reachable(loop) - bounded
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(root: str) -> None:
        # Iterative Tarjan: loops with hundreds of states must not hit the recursion limit.
        work = [(root, iter([n for n in successors(loop, root) if n in live]))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter([n for n in successors(loop, child) if n in live])))
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in successors(loop, node):
                    found.append(sorted(component, key=list(loop.states).index))

    for name in sorted(live, key=list(loop.states).index):
        if name not in index:
            visit(name)
    return found


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
