"""Where the loader's YAML events come from: libyaml in C when it is there, else ruamel.

Two sources, each `source(text) -> (events, resolve)`, give the same ruamel.yaml event
objects (ruamel.yaml.clib's `CParser` builds ruamel's own event classes):

- `reference_events`: ruamel.yaml's pure-Python round-trip parser. It defines what the
  loader accepts and every message it prints; it costs about 9 ms for a 40-line loop.
- `fast_events`: libyaml through ruamel.yaml.clib, about 0.2 ms for the same file. It is
  a fast path only. It raises `NeedsReferenceParser` on what it does not reproduce
  exactly: explicit tags (libyaml gives the expanded tag, not the `!!str` the user
  wrote), `%YAML` / `%TAG` directives (`%YAML 1.1` changes how scalars resolve; the fast
  path resolves as 1.2 only), and characters the two read differently (see
  `_REFERENCE_ONLY_CHARS`). The loader keeps its result only when the walk found
  nothing to report: any finding, syntax error or exception sends the file to the
  reference parser, so diagnostics are always the reference's own, and what the fast
  path changes is only how quickly a clean file loads.

`FAST_PARSER_AVAILABLE` is False when ruamel.yaml.clib is missing, fails to import, or
was built for another ruamel.yaml (its event classes are not ruamel's): then every file
goes through the reference parser, as before.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.events import (
    DocumentStartEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.resolver import VersionedResolver

from .yaml_walk import ResolvePlain

try:
    import _ruamel_yaml
except Exception:  # noqa: BLE001 - missing, or a broken build: either way use the reference
    _ruamel_yaml = None

# A clib built against other event classes would make the walk's isinstance checks fail
# silently (an empty document, say): only trust it when the classes are ruamel's own.
FAST_PARSER_AVAILABLE: bool = (
    _ruamel_yaml is not None
    and getattr(_ruamel_yaml, "ScalarEvent", None) is ScalarEvent
    and getattr(_ruamel_yaml, "MappingStartEvent", None) is MappingStartEvent
    and getattr(_ruamel_yaml, "DocumentStartEvent", None) is DocumentStartEvent
)


class NeedsReferenceParser(Exception):
    """The fast source met something only the reference parser renders exactly."""


# ---------------------------------------------------------------- reference (pure Python)

def reference_events(text: str) -> tuple[Iterator[Any], ResolvePlain]:
    """ruamel's round-trip parser; its resolver follows a `%YAML 1.1` directive."""
    yaml = YAML(typ="rt")
    resolver = yaml.resolver

    def resolve(value: str, implicit: Any) -> str:
        return str(resolver.resolve(ScalarNode, value, implicit))

    return yaml.parse(text), resolve


# ---------------------------------------------------------------- fast (libyaml in C)

# The YAML 1.2 core rules of ruamel's resolver, by first character, read once: the fast
# path always parses as 1.2 (a `%YAML` directive sends the file to the reference parser).
_RULES_1_2: dict[Any, list[tuple[Any, Any]]] = VersionedResolver(version=(1, 2)).versioned_resolver
_STR_TAG = str(VersionedResolver.DEFAULT_SCALAR_TAG)


# Plain scalars repeat a lot across the files of one lint run (keys above all): remember
# what each resolved to, up to a bound so a hostile file cannot grow it without end.
_RESOLVED_1_2: dict[str, str] = {}
_RESOLVED_MAX = 20_000


def resolve_plain_1_2(value: str, implicit: Any) -> str:
    """ruamel's `VersionedResolver.resolve` for a scalar under YAML 1.2, without its
    per-call version lookup: the same rules, tried in the same order."""
    if not implicit[0]:
        return _STR_TAG
    tag = _RESOLVED_1_2.get(value)
    if tag is None:
        tag = _STR_TAG
        for rule_tag, regexp in _RULES_1_2.get(value[:1], []) + _RULES_1_2.get(None, []):
            if regexp.match(value):
                tag = str(rule_tag)
                break
        if len(_RESOLVED_1_2) < _RESOLVED_MAX:
            _RESOLVED_1_2[value] = tag
    return tag


# Characters the two parsers read differently, found by feeding both the same fuzzed
# files: ruamel refuses a tab inside or after a plain scalar (`a: b\tc`, `a:\tb`) where
# libyaml reads it; libyaml (YAML 1.1) takes NEL, LS and PS as line breaks where ruamel
# (1.2) does not; ruamel does not count a BOM inside the text as a column. Rare in loop
# files, so a file holding any of them simply goes to the reference parser.
_REFERENCE_ONLY_CHARS = re.compile("[\t\x85\u2028\u2029\ufeff]")


def fast_events(text: str) -> tuple[Iterator[Any], ResolvePlain]:
    """libyaml's events, normalised to what the reference parser gives for the same text."""
    if not FAST_PARSER_AVAILABLE:
        raise NeedsReferenceParser("ruamel.yaml.clib is not available")
    if _REFERENCE_ONLY_CHARS.search(text):
        raise NeedsReferenceParser("a character the parsers read differently")
    return _c_events(text), resolve_plain_1_2


def _c_events(text: str) -> Iterator[Any]:
    assert _ruamel_yaml is not None
    next_event = _ruamel_yaml.CParser(text).get_event
    while True:
        event = next_event()
        if event is None:  # past the end of the stream
            return
        kind = type(event)
        if kind is ScalarEvent:
            if event.ctag is not None:
                raise NeedsReferenceParser("explicit tag")
            if not event.style:
                event.style = None  # libyaml says "" for plain, ruamel None
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            if event.ctag is not None:
                raise NeedsReferenceParser("explicit tag")
        elif kind is DocumentStartEvent and (event.version is not None or event.tags):
            raise NeedsReferenceParser("%YAML or %TAG directive")
        yield event
        if kind is StreamEndEvent:
            return
