"""Loading loop files: YAML text -> plain data + the line:col of every node.

CONTRACT (other modules rely on this; the implementation is being written):
- `load_document(path, text=None) -> tuple[Document | None, list[Diagnostic]]`
  never raises for any input (bytes, bad UTF-8, duplicate keys, tags, anchors that
  explode, over-deep nesting, empty files, non-mapping roots, multiple documents);
  returns (None, [errors]) when the file cannot be turned into data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .model import YamlPath


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

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()
