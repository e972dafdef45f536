"""Static reading of Jinja templates and expressions for lint.

Lint needs to know which names a template reads (`inputs.repo`, `draft.text`,
`secrets.TOKEN`) and on which line, without rendering it. Jinja's parser gives the
tree; this module walks it. Parsing only (no code generation) keeps lint fast:
compiling a template costs several times more than parsing it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

import jinja2
from jinja2 import nodes
from jinja2.parser import Parser

from .jinja_depth import check_nesting, check_tree_depth

_ENV = jinja2.Environment()


@dataclass(frozen=True)
class NameUse:
    root: str  # the global name read, e.g. "inputs"
    attr: str | None  # the first static attribute or key, e.g. "repo" in inputs.repo / inputs['repo']
    line: int  # 1-based line inside the template source


@dataclass(frozen=True)
class Scan:
    uses: tuple[NameUse, ...] = ()
    filters: frozenset[str] = field(default_factory=frozenset)


class ScanError(Exception):
    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.message = message
        self.line = line


def _walk(node: nodes.Node, parent: nodes.Node | None, out: list[tuple[nodes.Node, nodes.Node | None]]) -> None:
    out.append((node, parent))
    for child in node.iter_child_nodes():
        _walk(child, node, out)


@lru_cache(maxsize=4096)
def scan(source: str, expression: bool = False) -> Scan:
    """Names read by `source` (a template, or a bare expression when `expression`).

    Names the template binds itself ({% set %}, {% for %}, macro arguments) are left
    out. Scoping is approximated by "bound anywhere in the template", which is enough
    for the short templates loops carry.
    """
    try:
        check_nesting(_ENV, source, expression=expression)
        if expression:
            parser = Parser(_ENV, source, state="variable")
            expr = parser.parse_expression()
            if not parser.stream.eos:
                token = parser.stream.current
                raise jinja2.TemplateSyntaxError(
                    f"unexpected {token.type} {token.value!r} after the expression", token.lineno
                )
            tree: nodes.Node = nodes.Template([nodes.Output([expr])], lineno=1)
        else:
            tree = _ENV.parse(source)
        check_tree_depth(tree, len(source))
    except jinja2.TemplateSyntaxError as exc:
        raise ScanError(exc.message or str(exc), exc.lineno or 1) from None
    pairs: list[tuple[nodes.Node, nodes.Node | None]] = []
    _walk(tree, None, pairs)
    bound = {
        n.name for n, _ in pairs if isinstance(n, nodes.Name) and n.ctx in ("store", "param")
    }
    uses: list[NameUse] = []
    filters: set[str] = set()
    for node, parent in pairs:
        if isinstance(node, nodes.Filter):
            filters.add(node.name)
        if not isinstance(node, nodes.Name) or node.ctx != "load" or node.name in bound:
            continue
        if node.name in ("loop", "caller", "varargs", "kwargs", "true", "false", "none"):
            continue  # Jinja's own names
        attr: str | None = None
        if isinstance(parent, nodes.Getattr) and parent.node is node:
            attr = parent.attr
        elif (
            isinstance(parent, nodes.Getitem)
            and parent.node is node
            and isinstance(parent.arg, nodes.Const)
            and isinstance(parent.arg.value, str)
        ):
            attr = parent.arg.value
        uses.append(NameUse(node.name, attr, node.lineno))
    return Scan(tuple(uses), frozenset(filters))


def use_offset(source: str, use: NameUse) -> int:
    """Character offset of `use` inside `source` (its line's start when not found)."""
    lines = source.split("\n")
    index = min(max(use.line, 1), len(lines)) - 1
    line_start = sum(len(line) + 1 for line in lines[:index])
    root = re.escape(use.root)
    if use.attr is not None:
        attr = re.escape(use.attr)
        pattern = rf"(?<![\w.]){root}\s*(?:\.\s*{attr}\b|\[\s*['\"]{attr}['\"])"
    else:
        pattern = rf"(?<![\w.]){root}\b"
    found = re.search(pattern, lines[index])
    if found:
        return line_start + found.start()
    found = re.search(pattern, source)
    return found.start() if found else line_start
