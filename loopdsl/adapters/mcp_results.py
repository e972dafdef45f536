"""What the model sees of an MCP tool's result (DSL.md v1.1, precise rule "MCP").

`structuredContent` is shown as JSON (it is the result's data; the SDK's servers also put
its text rendering in `content`, which would say the same twice). Otherwise the content
blocks are joined: text as it is, and images, audio and resources as
`[<mime> <bytes> omitted]`, since v1.1 sends no images to the model. The text is then
redacted and capped by the caller (`safe_output`).
"""
from __future__ import annotations

import json
import re
from typing import Any

_UNKNOWN_MIME = "application/octet-stream"
# What a server says of a block it sends is shown whole or not at all: a value cut short
# could keep the start of a secret, which the redaction after (of whole secrets) would miss.
_MIME = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")
_KIND = re.compile(r"[A-Za-z_]{1,40}")


def render_result(result: Any) -> str:
    """The text of a `mcp.types.CallToolResult` (duck-typed: the SDK is an optional import)."""
    structured = getattr(result, "structuredContent", None)
    if structured is not None:
        return json.dumps(structured, ensure_ascii=False)
    return "\n".join(_block_text(block) for block in getattr(result, "content", None) or ())


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(getattr(block, "text", ""))
    if kind in ("image", "audio"):
        return _omitted(getattr(block, "mimeType", None), _base64_size(getattr(block, "data", "")))
    if kind == "resource":  # an embedded resource: text or base64 blob contents
        resource = getattr(block, "resource", None)
        text = getattr(resource, "text", None)
        size = len(text.encode("utf-8")) if isinstance(text, str) else _base64_size(getattr(resource, "blob", ""))
        return _omitted(getattr(resource, "mimeType", None), size)
    if kind == "resource_link":
        return _omitted(getattr(block, "mimeType", None), getattr(block, "size", None))
    return f"[{kind if isinstance(kind, str) and _KIND.fullmatch(kind) else 'unknown'} content omitted]"


def _omitted(mime: Any, size: Any) -> str:
    mime_text = mime if isinstance(mime, str) and _MIME.fullmatch(mime) else _UNKNOWN_MIME
    size_text = str(size) if isinstance(size, int) and not isinstance(size, bool) else "unknown"
    return f"[{mime_text} {size_text} bytes omitted]"


def _base64_size(data: Any) -> int:
    """Decoded size of base64 text, without decoding it (it may be large or invalid)."""
    if not isinstance(data, str):
        return 0
    compact = "".join(data.split())  # encoders may wrap lines
    body, padding = len(compact), len(compact) - len(compact.rstrip("="))
    return max(body * 3 // 4 - padding, 0)
