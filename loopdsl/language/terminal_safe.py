"""Run data made safe to print on a terminal.

Model replies, command output, file names and store records are hostile: an escape sequence
in them would reach the person's terminal as a command (OSC 52 writes the clipboard, OSC 8
hides a link's target, OSC 0 retitles the window, `\\r` and cursor moves overwrite what was
printed, C1 controls act like ESC on some terminals, bidi overrides reorder text). Every
printer of run data passes its text through `visible` (or `visible_json` for JSON output),
which shows such characters as escapes (`\\x1b`) instead of sending them. Newlines and tabs
are kept.
"""
from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, C1 controls, the bidi embedding, override and
# isolate characters, and lone UTF-16 surrogates (no terminal shows one; writing one to a
# UTF-8 stream raises).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# In JSON text, C0 controls are already escaped by the encoder; the rest may be raw.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with terminal control characters shown as escapes (ESC -> `\\x1b`)."""
    return _UNSAFE.sub(_escape, text)


def visible_json(text: str) -> str:
    """JSON text (from json.dumps) with the control characters it may hold raw written as
    `\\u` escapes: still the same JSON value, now inert on a terminal."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
