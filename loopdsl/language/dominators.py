"""Dominators of a state graph, in near-linear time and space.

State `a` dominates `b` when every path from `start` to `b` passes through `a`; lint uses it
to know which results surely exist where a template reads them. Holding every state's full
dominator set costs n² for a chain of n states (10,000 states: 100 million set entries), so
this keeps the dominator tree instead (each state's immediate dominator) and answers
"does a dominate b" in constant time from a pre/post numbering of that tree.

The immediate dominators come from Cooper, Harvey and Kennedy, "A Simple, Fast Dominance
Algorithm" (2001): iterate over the states in reverse postorder, intersecting the dominators
of the processed predecessors by walking up the tree. Every walk here is iterative.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


class DominatorTree:
    def __init__(self, start: str, edges: Mapping[str, Sequence[str]]):
        self._start = start
        order = _postorder(start, edges) if start in edges else []
        self._post_index = {name: i for i, name in enumerate(order)}
        self.idom = _immediate_dominators(start, order, self._post_index, edges)
        self._enter, self._leave = _tree_numbering(start, self.idom)

    def __contains__(self, name: object) -> bool:
        """Whether `name` is reachable from start (only those have dominators)."""
        return name in self._enter

    def dominates(self, a: str, b: str) -> bool:
        """Every path from start to `b` passes through `a` (a state dominates itself)."""
        if a not in self._enter or b not in self._enter:
            return False
        return self._enter[a] <= self._enter[b] and self._leave[b] <= self._leave[a]

    def common_dominator(self, names: Iterable[str]) -> str | None:
        """The deepest state dominating every one of `names` (None when there are none)."""
        result: str | None = None
        for name in names:
            if name not in self._enter:
                continue
            if result is None:
                result = name
                continue
            while not self.dominates(result, name):
                result = self.idom[result]
        return result


def _postorder(start: str, edges: Mapping[str, Sequence[str]]) -> list[str]:
    order: list[str] = []
    seen = {start}
    stack = [(start, iter(edges.get(start, ())))]
    while stack:
        name, successors = stack[-1]
        for successor in successors:
            if successor not in seen and successor in edges:
                seen.add(successor)
                stack.append((successor, iter(edges.get(successor, ()))))
                break
        else:
            stack.pop()
            order.append(name)
    return order


def _immediate_dominators(start: str, order: list[str], post_index: Mapping[str, int],
                          edges: Mapping[str, Sequence[str]]) -> dict[str, str]:
    predecessors: dict[str, list[str]] = {name: [] for name in order}
    for name in order:
        for successor in edges.get(name, ()):
            if successor in predecessors:
                predecessors[successor].append(name)
    idom: dict[str, str] = {start: start} if order else {}

    def intersect(a: str, b: str) -> str:
        while a != b:
            while post_index[a] < post_index[b]:
                a = idom[a]
            while post_index[b] < post_index[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for name in reversed(order):
            if name == start:
                continue
            new: str | None = None
            for pred in predecessors[name]:
                if pred in idom:
                    new = pred if new is None else intersect(pred, new)
            if new is not None and idom.get(name) != new:
                idom[name] = new
                changed = True
    return idom


def _tree_numbering(start: str, idom: Mapping[str, str]) -> tuple[dict[str, int], dict[str, int]]:
    children: dict[str, list[str]] = {}
    for name, parent in idom.items():
        if name != parent:
            children.setdefault(parent, []).append(name)
    enter: dict[str, int] = {}
    leave: dict[str, int] = {}
    if start not in idom:
        return enter, leave
    clock = 0
    stack: list[tuple[str, bool]] = [(start, False)]
    while stack:
        name, done = stack.pop()
        clock += 1
        if done:
            leave[name] = clock
            continue
        enter[name] = clock
        stack.append((name, True))
        stack.extend((child, False) for child in children.get(name, ()))
    return enter, leave
