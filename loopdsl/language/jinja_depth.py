"""Nesting bounds for Jinja sources, checked before Jinja's recursive parser and code
generator see them.

Jinja parses brackets, blocks and unary operators by recursion and generates code by
recursion over the tree, so 70 nested parentheses or 2,000 nested `{% if %}` raise
RecursionError deep inside Jinja. These checks refuse such sources first, as an ordinary
TemplateSyntaxError naming the line, which lint and the engine already report as a syntax
error. Both walks are iterative.
"""
from __future__ import annotations

from jinja2 import Environment, TemplateSyntaxError, nodes

# Brackets, blocks and unary operators open at once. Real templates stay under ten; Jinja's
# parser spends up to ~15 frames per level, so this stays far below Python's recursion limit.
MAX_NESTING = 32
# `{% for %}` loops open at once: each becomes a Python loop, and Python refuses to compile
# more than 20 statically nested loops/try/with blocks.
MAX_LOOP_NESTING = 16
# Depth of the parsed tree (`a + b + ...` and `x | f | g ...` nest one level per operator).
MAX_TREE_DEPTH = 100

# Block tags closed by a matching `end...` tag. `set` opens a block only without `=`.
_BLOCK_TAGS = frozenset({"if", "for", "macro", "call", "filter", "with", "block", "autoescape", "set", "trans"})
_UNARY = frozenset({"not", "-", "+"})


class NestingTooDeep(TemplateSyntaxError):
    """A source nests deeper than the bounds above."""


def _too_deep(what: str, limit: int, lineno: int) -> NestingTooDeep:
    return NestingTooDeep(
        f"{what} nest more than {limit} levels deep; split it into smaller templates or "
        "compute parts in `set` states", lineno)


def check_nesting(env: Environment, source: str, *, expression: bool = False) -> None:
    """Raise TemplateSyntaxError when brackets, blocks and unary operators in `source`
    nest deeper than MAX_NESTING. Sources that do not lex are left to the parser."""
    if sum(map(source.count, "([{-+")) + source.count("not") <= MAX_NESTING:
        return  # too few openers to nest that deep: skip lexing (nearly every real source)
    text = "{{ " + source + " }}" if expression else source
    depth = unary_run = loops = 0
    tag: str | None = None
    tag_assigns = expecting_tag = False
    try:
        for lineno, kind, value in env.lex(text):
            if kind == "whitespace":
                continue
            unary_run = unary_run + 1 if value in _UNARY and kind in ("name", "operator") else 0
            if kind == "block_begin":
                expecting_tag, tag, tag_assigns = True, None, False
            elif kind == "name" and expecting_tag:
                expecting_tag, tag = False, value
            elif kind == "operator" and value in "([{":
                depth += 1
            elif kind == "operator" and value in ")]}":
                depth -= 1
            elif kind == "operator" and value == "=":
                tag_assigns = True
            elif kind == "block_end" and tag is not None:
                if tag in _BLOCK_TAGS and not (tag == "set" and tag_assigns):
                    depth += 1
                    loops += tag == "for"
                elif tag.startswith("end"):
                    depth -= 1
                    loops -= tag == "endfor"
                tag = None
                if loops > MAX_LOOP_NESTING:
                    raise _too_deep("`{% for %}` loops", MAX_LOOP_NESTING, lineno)
            if depth + unary_run > MAX_NESTING:
                raise _too_deep("brackets, blocks and unary operators", MAX_NESTING, lineno)
    except NestingTooDeep:
        raise
    except TemplateSyntaxError:
        return  # a lexing error: the parser reports it in its own words


def check_tree_depth(tree: nodes.Node, source_length: int | None = None) -> None:
    """Raise TemplateSyntaxError when the parsed tree is deeper than MAX_TREE_DEPTH.
    `source_length`: a source this short cannot make such a tree (each level takes at
    least one character), so the walk is skipped."""
    if source_length is not None and source_length < MAX_TREE_DEPTH - 10:
        return
    stack: list[tuple[nodes.Node, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            raise _too_deep("operators and blocks", MAX_TREE_DEPTH, getattr(node, "lineno", 1) or 1)
        stack.extend((child, depth + 1) for child in node.iter_child_nodes())
