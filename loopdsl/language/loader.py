"""Loading loop files: YAML text -> plain data + the line:col of every node.

CONTRACT (other modules rely on this):
- `load_document(path, text=None) -> tuple[Document | None, list[Diagnostic]]`
  never raises for any input (bytes, bad UTF-8, duplicate keys, tags, anchors that
  explode, over-deep nesting, empty files, non-mapping roots, multiple documents);
  returns (None, [errors]) when the file cannot be turned into data, and
  (Document, []) otherwise.

How: a parser turns the text into events, and one pass over those events
(`yaml_walk.Walker`) builds the plain data, the positions, and every safety check at
once. We do not let ruamel compose or construct: its composer forgets whether a tag was
written explicitly (so `!!str` and verbatim tags would slip through), its duplicate-key
error does not say where the first key was, and its constructor would hand back
ruamel types. Working on events also means aliases are never expanded, only counted,
so a billion-laughs file costs as much as its text.

The events come from libyaml (ruamel.yaml.clib) when it is installed, and from
ruamel's pure-Python parser otherwise or whenever the file has anything to report: see
`yaml_events` for why the two give the same result.
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.reader import ReaderError

from .diagnostics import Diagnostic
from .files import MAX_FILE_BYTES, TOO_LARGE, read_capped
from .model import YamlPath
from .yaml_events import FAST_PARSER_AVAILABLE, fast_events, reference_events
from .yaml_walk import MAX_DEPTH, MAX_NODES, ResolvePlain, Stop, Walker, mark_position
from .yaml_walk import diagnostic as _error

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_NODES", "Document", "load_document", "load_text", "parse_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


@dataclass
class Document:
    path: str  # as given by the user (used in diagnostics)
    text: str
    data: Any  # plain dict / list / str / int / float / bool / None, no ruamel types
    # 1-based (line, col) of each mapping key and sequence item, by YAML path.
    positions: dict[YamlPath, tuple[int, int]] = field(default_factory=dict)
    # 1-based (line, col) where the value of that key / item starts.
    value_positions: dict[YamlPath, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: YamlPath, *, value: bool = False) -> tuple[int, int]:
        """Position of `path`, or of its longest known prefix; (1, 1) for the root."""
        table = self.value_positions if value else self.positions
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if not value and p in self.value_positions:
                return self.value_positions[p]
            p = p[:-1]
        return (1, 1)

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines()



def _line_col_of_index(text: str, index: int) -> tuple[int, int]:
    """1-based line:col of a character offset, counting line breaks the way YAML does."""
    index = max(0, min(index, len(text)))
    line, line_start = 1, 0
    for brk in _LINE_BREAK.finditer(text, 0, index):
        line, line_start = line + 1, brk.end()
    return (line, index - line_start + 1)


# ---------------------------------------------------------------- decoding

def _decode(path: str, raw: str | bytes) -> tuple[str | None, list[Diagnostic]]:
    """Bytes or str -> clean text, or an encoding diagnostic."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        data = bytes(raw)
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            return None, [_error(path, (1, 1), "yaml-encoding",
                                 "the file is UTF-16/UTF-32 encoded (it starts with a byte-order mark)")]
        nul = data.find(b"\x00")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if 0 <= nul < exc.start:
                return None, [_nul_error(path, data.decode("utf-8", "replace"), nul)]
            # Everything before the bad byte decoded fine: count lines and columns in it
            # as an editor would (characters), and give the byte offset for hex editors.
            before = data[:exc.start].decode("utf-8")
            where = _line_col_of_index(before, len(before))
            bad = data[exc.start:exc.start + 1].hex()
            return None, [_error(path, where, "yaml-encoding",
                                 f"the file is not valid UTF-8: byte 0x{bad} at byte offset "
                                 f"{exc.start}; save it as UTF-8")]
    else:
        text = str(raw)
    text = text.removeprefix("\ufeff")  # a UTF-8 BOM is allowed and invisible in editors
    nul = text.find("\x00")
    if nul >= 0:
        return None, [_nul_error(path, text, nul)]
    surrogate = _SURROGATE.search(text)
    if surrogate:
        return None, [_error(path, _line_col_of_index(text, surrogate.start()), "yaml-encoding",
                             f"the text holds a lone surrogate (U+{ord(surrogate.group()):04X}), "
                             "which is not valid Unicode")]
    return text, []


def _nul_error(path: str, text: str, index: int) -> Diagnostic:
    return _error(path, _line_col_of_index(text, index), "yaml-encoding",
                  "the file contains a NUL byte (is it binary, or UTF-16 without a byte-order mark?)")


# ---------------------------------------------------------------- public API

def _yaml_error(path: str, text: str, exc: Exception) -> Diagnostic:
    """A ruamel exception -> one diagnostic at the place ruamel blames."""
    if isinstance(exc, ReaderError):
        where = _line_col_of_index(text, exc.position if isinstance(exc.position, int) else 0)
        # ruamel gives the code point as an int (str input) or a character (bytes input).
        char = exc.character
        code = char if isinstance(char, int) else ord(char[:1]) if isinstance(char, str) and char else 0
        return _error(path, where, "yaml-encoding", "the file contains a control character "
                      f"(U+{code:04X}) that YAML does not allow")
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = mark_position(mark) if mark is not None else (0, 0)
        problem = " ".join(str(exc.problem or "invalid YAML").split())
        context = " ".join(str(exc.context or "").split())
        if context and exc.context_mark is not None and exc.context_mark is not mark:
            problem += f" ({context} that starts at line {exc.context_mark.line + 1}, " \
                       f"column {exc.context_mark.column + 1})"
        elif context:
            problem += f" ({context})"
        return _error(path, where, "yaml-syntax", problem)
    if isinstance(exc, YAMLError):
        return _error(path, (0, 0), "yaml-syntax", f"invalid YAML: {exc}".strip())
    # Not a YAML error at all: a ruamel bug hit by odd input. Still the user's file is at
    # fault in practice, so say so plainly rather than crash.
    return _error(path, (0, 0), "yaml-syntax", "the YAML parser failed on this file "
                  f"({type(exc).__name__}: {str(exc)[:200]})")



def _walk(path: str, text: str, events: Any, resolve: ResolvePlain) -> Walker:
    walker = Walker(path, resolve)
    try:
        walker.run(events)
    except Stop:
        pass
    except RecursionError:
        walker.errors.append(_error(path, (0, 0), "yaml-too-deep",
                                    "the structure is nested too deeply to read"))
    except Exception as exc:  # noqa: BLE001 - every input must end as a diagnostic
        walker.errors.append(_yaml_error(path, text, exc))
    return walker


def _fast_walk(path: str, text: str) -> Walker | None:
    """The walk over libyaml's events, or None when the reference parser must decide."""
    try:
        events, resolve = fast_events(text)
        walker = Walker(path, resolve)
        walker.run(events)
    except Stop:
        # Nesting past MAX_DEPTH stops both walks at the same event with the same findings, and
        # the reference parser takes ~0.7 s of CPU to get there through a deep flow sequence
        # (ruamel's scanner looks up to 1,024 characters ahead at every bracket): decided here.
        return walker if walker.errors and walker.errors[-1].rule == "yaml-too-deep" else None
    except Exception:  # noqa: BLE001 - a libyaml error, NeedsReferenceParser, ...
        return None
    return None if walker.errors else walker


def parse_text(path: str, text: str, *, fast: bool = True) -> tuple[Document | None, list[Diagnostic]]:
    """Decoded text -> (Document, []) or (None, errors). `fast=False` skips libyaml and
    uses only the reference parser (tests compare the two; results must not differ)."""
    walker = _fast_walk(path, text) if fast and FAST_PARSER_AVAILABLE else None
    if walker is None:
        with warnings.catch_warnings():
            # ruamel warns (e.g. about YAML 1.1 floats) on stderr; lint reports, it never chats.
            warnings.simplefilter("ignore")
            events, resolve = reference_events(text)
            walker = _walk(path, text, events, resolve)
    if walker.errors:
        return None, walker.errors
    if not isinstance(walker.root, dict):  # unreachable by construction; keep the promise
        return None, [_error(path, (1, 1), "yaml-not-mapping",
                             "the top level of a loop file must be a mapping")]
    return Document(path=path, text=text, data=walker.root, positions=walker.positions,
                    value_positions=walker.value_positions), []


def load_document(path: str | os.PathLike[str],
                  text: str | bytes | None = None) -> tuple[Document | None, list[Diagnostic]]:
    """Read and parse one loop file; never raises. (None, errors) if it is not usable data."""
    try:
        shown = os.fsdecode(path)
    except Exception:  # noqa: BLE001 - an odd path object still gets a name
        shown = repr(path)
    try:
        if text is None:
            try:
                raw: str | bytes = read_capped(path)
            except OSError as exc:
                reason = exc.strerror or type(exc).__name__
                return None, [_error(shown, (0, 0), "file-unreadable",
                                     f"cannot read the file: {reason}")]
        elif len(text) > MAX_FILE_BYTES:
            return None, [_error(shown, (0, 0), "file-unreadable", f"cannot read the file: {TOO_LARGE}")]
        else:
            raw = text
        decoded, problems = _decode(shown, raw)
        if decoded is None:
            return None, problems
        return parse_text(shown, decoded)
    except Exception as exc:  # noqa: BLE001 - last defence: a loader bug is no traceback
        return None, [_error(shown, (0, 0), "yaml-syntax",
                             f"internal error while reading the file ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); please report it")]


def load_text(text: str | bytes, path: str = "<string>") -> tuple[Document | None, list[Diagnostic]]:
    """`load_document` for text that is not (or not yet) in a file."""
    return load_document(path, text)

