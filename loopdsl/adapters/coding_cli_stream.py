"""Bounded reading of a CLI's pipes: stdout split into lines without ever holding a huge
one in memory, stderr kept as its last few KiB (where error messages are)."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

# A real event (a tool result holding a whole file) can be large; anything past this is
# not read as JSON at all, only counted as skipped.
MAX_LINE = 4 * 1024 * 1024


class LineSplitter:
    """Splits a byte stream into lines. A line longer than `max_line` is reported once as
    (first `max_line` bytes, oversized=True) and the rest of it is dropped as it arrives."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        self._dropping = False  # inside an oversized line, until its newline

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, bool]]:
        """Lines completed by `chunk`; an empty chunk (EOF) flushes the last, unterminated one."""
        if not chunk:
            if self._buffer and not self._dropping:
                yield bytes(self._buffer), False
            self._buffer.clear()
            self._dropping = False
            return
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            if not self._dropping:
                self._buffer += chunk[start:end]
                if len(self._buffer) > self.max_line:
                    yield bytes(self._buffer[: self.max_line]), True
                    self._buffer.clear()
                    self._dropping = True
            if newline < 0:
                return
            if not self._dropping:
                yield bytes(self._buffer), False
            self._buffer.clear()
            self._dropping = False
            start = newline + 1


class TailBuffer:
    """Reads a pipe to EOF keeping only its last `keep` bytes."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.data = bytearray()
        self.total = 0

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while True:
            chunk = await stream.read(64 * 1024)
            if not chunk:
                return
            self.total += len(chunk)
            self.data += chunk
            if len(self.data) > self.keep:
                del self.data[: len(self.data) - self.keep]

    def text(self) -> str:
        text = bytes(self.data).decode("utf-8", errors="replace")
        return text if self.total <= self.keep else f"[... {self.total - self.keep} bytes cut ...]\n{text}"
