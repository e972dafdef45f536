"""The loader's one pass over YAML events: plain data + positions + every safety check.

`Walker.run(events)` consumes ruamel.yaml event objects (from either source in
`yaml_events`) and builds plain dict / list / scalar data, the 1-based line:col of every
key, item and value, and diagnostics for what a loop file may not hold: explicit tags,
duplicate or non-string keys, alias expansion past a node budget, nesting past a depth
limit, more than one document, an empty document. Aliases are never expanded, only
counted, so a billion-laughs file costs as much as its text.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    DocumentStartEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceStartEvent,
    StreamEndEvent,
)

from .diagnostics import Diagnostic, Severity
from .model import YamlPath
from .yaml_scalars import MAX_INT_DIGITS, ResolvePlain, scalar_value

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "MAX_NODES", "ResolvePlain", "Stop", "Walker", "diagnostic", "mark_position"]

MAX_DEPTH = 64
# Expanded size (aliases counted as many times as they are used) above which a file is
# refused: far beyond any real loop, far below what hurts schema validation or memory.
MAX_NODES = 100_000
# One run reports every tag / duplicate key / bad key, but a hostile file could hold
# thousands: past this many the rest are dropped.
MAX_COLLECTED_ERRORS = 50

HINTS = {
    "yaml-syntax": "Check indentation (spaces only, no tabs) and quoting: a value that "
    "contains ': ' or ' #', or starts with one of { } [ ] & * ! | > ' \" % @ `, must be quoted.",
    "yaml-duplicate-key": "Each key may appear once per mapping; remove or rename one of them "
    "(YAML tools disagree on which one wins).",
    "yaml-tag": "Loop files are plain data: remove the tag and write the value itself "
    "(quote it if it must stay a string).",
    "yaml-anchor-bomb": "Aliases (*name) expand to copies of their anchor (&name); write the "
    "structure out or use fewer nested aliases.",
    "yaml-too-deep": f"Loop files never need more than {MAX_DEPTH} levels of nesting; flatten "
    "the structure.",
    "yaml-empty": "Start from `loopdsl init` or a file in loops/; a loop needs at least "
    "`loopdsl: 1`, `name`, `start` and `states`.",
    "yaml-not-mapping": "The top level of a loop file is a mapping of keys such as "
    "`loopdsl: 1`, `name: ...`, `states: ...`.",
    "yaml-multi-document": "A loop file holds one YAML document: remove the second `---` "
    "and what follows, or move it to its own file.",
    "yaml-encoding": "Save the file as UTF-8 text (no UTF-16, no NUL or control characters).",
    "yaml-non-string-key": "Keys must be strings: quote keys such as \"1\", \"true\", \"null\" "
    "or \"2024-01-01\", and do not use lists or mappings as keys.",
    "file-unreadable": "Check the path and that the file is readable.",
}


class Stop(Exception):
    """A fatal finding: the walk cannot go on (the diagnostic is already recorded)."""


def diagnostic(path: str, where: tuple[int, int], rule: str, message: str,
               related: tuple[tuple[str, int, int, str], ...] = ()) -> Diagnostic:
    """An error diagnostic with the rule's standard hint."""
    return Diagnostic(path=path, line=where[0], col=where[1], severity=Severity.ERROR,
                      rule=rule, message=message, hint=HINTS.get(rule, ""), related=related)


def mark_position(mark: Any) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


# ---------------------------------------------------------------- event walk

class _Frame:
    """One open mapping or sequence while walking the events."""

    # A plain slotted class, not a dataclass: one is made per collection of every file,
    # and a dataclass's generated code costs import time on every `loopdsl` start.
    __slots__ = ("anchor", "container", "drop_value", "has_key", "is_merge", "key", "key_pos",
                 "merges", "path", "size", "start")

    def __init__(self, container: dict[str, Any] | list[Any], path: YamlPath,
                 start: tuple[int, int], anchor: str | None) -> None:
        self.container = container
        self.path = path
        self.start = start
        self.anchor = anchor
        self.size = 1  # expanded node count of this collection so far
        # Mappings only: the key waiting for its value.
        self.key: Any = None
        self.key_pos = (1, 1)
        self.has_key = False
        self.drop_value = False  # the pending key was rejected (reported): ignore its value
        self.is_merge = False
        self.merges: list[tuple[dict[str, Any], tuple[int, int], tuple[int, int]]] = []


class _Anchor(NamedTuple):
    data: Any
    size: int
    is_str: bool


# Path component for nodes under a rejected key (complex keys, duplicates): a unique
# object, so it can never equal a real key. Such paths only exist when there are errors,
# and then no Document is returned.
_NOWHERE: Any = object()


class Walker:
    """Builds data + positions from parser events, checking tags, keys, depth and size."""

    def __init__(self, path: str, resolve: ResolvePlain) -> None:
        self.path = path
        self.resolve = resolve
        self.errors: list[Diagnostic] = []
        self.positions: dict[YamlPath, tuple[int, int]] = {}
        self.value_positions: dict[YamlPath, tuple[int, int]] = {}
        self.anchors: dict[str, _Anchor] = {}
        self.stack: list[_Frame] = []
        self.total_nodes = 0
        self.version: tuple[int, ...] = (1, 2)
        self.root: Any = None

    def fatal(self, where: tuple[int, int], rule: str, message: str) -> Stop:
        self.errors.append(diagnostic(self.path, where, rule, message))
        return Stop()

    def collect(self, where: tuple[int, int], rule: str, message: str,
                related: tuple[tuple[str, int, int, str], ...] = ()) -> None:
        if len(self.errors) < MAX_COLLECTED_ERRORS:
            self.errors.append(diagnostic(self.path, where, rule, message, related))

    # ---- the walk
    def run(self, events: Iterable[Any]) -> None:
        documents = 0
        for event in events:
            if isinstance(event, DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise self.fatal(mark_position(event.start_mark), "yaml-multi-document",
                                     "the file holds more than one YAML document "
                                     "(a second document starts here)")
                if event.version:
                    self.version = tuple(event.version)
            elif isinstance(event, (ScalarEvent, AliasEvent, SequenceStartEvent,
                                    MappingStartEvent)):
                self.open_node(event)
            elif isinstance(event, CollectionEndEvent):
                self.close_collection()
            elif isinstance(event, StreamEndEvent):
                break
        if documents == 0:
            raise self.fatal((1, 1), "yaml-empty", "the file is empty (or holds only comments)")

    def count(self, n: int, where: tuple[int, int]) -> None:
        self.total_nodes += n
        if self.total_nodes > MAX_NODES:
            raise self.fatal(where, "yaml-anchor-bomb",
                             f"the document expands to more than {MAX_NODES:,} nodes "
                             "(each use of an alias counts its whole anchor again)")

    def open_node(self, event: Any) -> None:
        where = mark_position(event.start_mark)
        if not self.stack and not isinstance(event, MappingStartEvent):
            self.reject_root(event, where)
        tag = getattr(event, "ctag", None)
        if tag is not None:
            self.collect(where, "yaml-tag", f"explicit YAML tag `{_tag_text(tag)}` is not allowed")
        if isinstance(event, AliasEvent):
            self.alias(event.anchor, where)
        elif isinstance(event, ScalarEvent):
            self.count(1, where)
            value, kind = self.scalar(event, where)
            if event.anchor is not None:
                self.anchors[event.anchor] = _Anchor(value, 1, kind == "str")
            empty = event.value == "" and event.style is None and tag is None
            self.attach(value, where, 1, kind, empty=empty)
        else:
            if len(self.stack) >= MAX_DEPTH:
                raise self.fatal(where, "yaml-too-deep",
                                 f"the structure is nested deeper than {MAX_DEPTH} levels")
            self.count(1, where)
            container: dict[str, Any] | list[Any] = (
                {} if isinstance(event, MappingStartEvent) else [])
            self.stack.append(_Frame(container, self.next_path(), where, event.anchor))

    def reject_root(self, event: Any, where: tuple[int, int]) -> None:
        if (isinstance(event, ScalarEvent) and event.value == "" and event.style is None
                and event.anchor is None and getattr(event, "ctag", None) is None):
            raise self.fatal(where, "yaml-empty", "the document is empty")
        found = "a list" if isinstance(event, SequenceStartEvent) else (
            "an alias" if isinstance(event, AliasEvent) else "a single value")
        raise self.fatal(where, "yaml-not-mapping",
                         f"the top level of a loop file must be a mapping, found {found}")

    def next_path(self) -> YamlPath:
        """The path the node being opened will have in its parent."""
        if not self.stack:
            return ()
        parent = self.stack[-1]
        if isinstance(parent.container, list):
            return parent.path + (len(parent.container),)
        if not parent.has_key or parent.drop_value or parent.is_merge:
            return parent.path + (_NOWHERE,)
        return parent.path + (parent.key,)

    def alias(self, name: str, where: tuple[int, int]) -> None:
        target = self.anchors.get(name)
        if target is None:
            if any(frame.anchor == name for frame in self.stack):
                raise self.fatal(where, "yaml-anchor-bomb",
                                 f"alias *{name} is used inside its own anchor &{name}: "
                                 "the structure would be infinitely deep")
            raise self.fatal(where, "yaml-syntax",
                             f"alias *{name} has no anchor &{name} before it")
        self.count(target.size, where)
        # Shared, not copied: the node budget bounds what any consumer walking the data
        # can see, and loaded data is read-only by convention.
        self.attach(target.data, where, target.size, "str" if target.is_str else "other")

    def scalar(self, event: Any, where: tuple[int, int]) -> tuple[Any, str]:
        """The scalar's value and kind: "str", "merge" (the `<<` key) or "other"."""
        return scalar_value(event, where, self.resolve, self.version, self.collect)

    # ---- building
    def attach(self, value: Any, where: tuple[int, int], size: int, kind: str,
               *, empty: bool = False) -> None:
        """Put a finished node into its parent, or make it the root."""
        if not self.stack:
            self.root = value
            return
        parent = self.stack[-1]
        parent.size += size
        container = parent.container
        if isinstance(container, list):
            item_path = parent.path + (len(container),)
            self.positions[item_path] = where
            self.value_positions[item_path] = where
            container.append(value)
        elif not parent.has_key:
            self.take_key(parent, value, where, kind)
        else:
            parent.has_key = False
            if parent.drop_value:
                return
            if parent.is_merge:
                self.take_merge(parent, value, where)
                return
            key_path = parent.path + (parent.key,)
            # An empty value (`key:`) has no text of its own: point at the key instead.
            self.value_positions[key_path] = parent.key_pos if empty else where
            container[parent.key] = value

    def take_key(self, parent: _Frame, key: Any, where: tuple[int, int], kind: str) -> None:
        container = parent.container
        assert isinstance(container, dict)
        parent.has_key, parent.key, parent.key_pos = True, key, where
        parent.drop_value = parent.is_merge = False
        if kind == "merge":
            parent.is_merge = True
            return
        if kind != "str" or not isinstance(key, str):
            parent.drop_value = True
            self.collect(where, "yaml-non-string-key",
                         f"mapping keys must be strings, found {_describe(key)}")
            return
        key_path = parent.path + (key,)
        if key in container:
            parent.drop_value = True
            first = self.positions.get(key_path, where)
            self.collect(where, "yaml-duplicate-key",
                         f"duplicate key `{key}` (first defined at line {first[0]})",
                         related=((self.path, first[0], first[1], f"`{key}` first defined here"),))
            return
        self.positions[key_path] = where
        container[key] = None  # placeholder: makes a later duplicate visible at once

    def take_merge(self, parent: _Frame, value: Any, where: tuple[int, int]) -> None:
        sources = value if isinstance(value, list) else [value]
        if not sources or not all(isinstance(source, dict) for source in sources):
            self.collect(where, "yaml-syntax", "a merge key `<<` takes a mapping or a list of "
                         "mappings (usually an alias, as in `<<: *defaults`)")
            return
        for source in sources:
            parent.merges.append((source, parent.key_pos, where))

    def close_collection(self) -> None:
        frame = self.stack.pop()
        container = frame.container
        if isinstance(container, dict):
            # Keys written in the mapping win over merged ones; earlier sources win.
            for source, key_pos, value_pos in frame.merges:
                for key, value in source.items():
                    if key not in container:
                        container[key] = value
                        self.positions[frame.path + (key,)] = key_pos
                        self.value_positions[frame.path + (key,)] = value_pos
        if frame.anchor is not None:
            self.anchors[frame.anchor] = _Anchor(container, frame.size, False)
        self.attach(container, frame.start, frame.size, "other")


def _tag_text(tag: Any) -> str:
    handle, suffix = getattr(tag, "handle", None), getattr(tag, "suffix", None)
    if handle is not None and suffix is not None:
        return f"{handle}{suffix}"
    text = str(tag)
    return text if text.startswith("!") else f"!<{text}>"


def _describe(key: Any) -> str:
    if isinstance(key, list):
        return "a list"
    if isinstance(key, dict):
        return "a mapping"
    if key is None:
        return "null"
    if isinstance(key, str):
        return f"`{key}`"
    kind = "boolean" if isinstance(key, bool) else "number"
    return f"the {kind} {key!r}"

