"""The parts of a loop file the schema accepted, so lint's semantic rules can run on them.

A schema error in one state must not hide an unknown model in another: lint shows every
problem at once. `accepted_parts` removes each node the schema rejected (and whatever
its removal leaves invalid), puts a neutral stand-in where the model needs a value
(a model alias without `model`, a loop without `start`), and says which YAML paths it
touched, so that findings about those parts come from the schema alone. Findings that
would only echo a removed key (a call "has no max_tokens" when the alias's was rejected)
are left out too, and so are claims drawn from the state graph when a state was rejected.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..language.loader import Document
from ..language.model import YamlPath

# Sections whose entries are named by the user; an entry is one unit of salvage.
NAMED_SECTIONS = ("states", "models", "gates", "inputs")
# Graph rules need every state's routing and the budget; they run only when the schema
# accepted all of them (a misspelt `nxt:` would otherwise also read as a dead end).
_GRAPH_INPUTS = ("states", "start", "budget")
_MAX_ROUNDS = 6
# Rules whose finding would only echo a rejected key: with `max_tokens: lots` removed from
# an alias, "this call has no max_tokens" is not news. Keyed by the rejected key, the whole
# section (`models`), or one entry of it replaced by a stand-in (`models.*`).
_ECHOED_RULES: dict[str, frozenset[str]] = {
    key: frozenset(rules) for key, rules in {
        "models": ("unknown-model", "llm-max-tokens", "max-tokens-over-limit", "unknown-price", "evaluator-mirrors-generator"),
        "models.*": ("llm-max-tokens", "max-tokens-over-limit", "unknown-price", "evaluator-mirrors-generator"),
        "gates.*": ("gate-needs-value",),
        "inputs.*": ("with-type",),
        "model": ("unknown-price", "evaluator-mirrors-generator"),
        "max_tokens": ("llm-max-tokens", "max-tokens-over-limit"),
        "price": ("unknown-price",),
        "fallbacks": ("unknown-price",),
        "temperature": ("evaluator-mirrors-generator",),
        "inputs": ("unknown-input", "with-type"),
        "secrets": ("unknown-secret", "secret-in-command", "secret-in-prompt", "child-secret"),
        "gates": ("unknown-gate", "gate-needs-value"),
        "value": ("gate-needs-value",),
        "with": ("with-missing-input", "with-unknown-input", "with-type"),
        "unattended": ("checkpoint-unattended",),
    }.items()
}
_STAND_IN_GATE = {"expr": "true"}

Validate = Callable[[Document], Iterable[YamlPath]]


@dataclass(frozen=True)
class Accepted:
    doc: Document  # the document with rejected parts removed (positions unchanged)
    touched: tuple[YamlPath, ...]  # paths removed or replaced by a stand-in
    graph_complete: bool  # whether graph rules can trust the states, start and budget

    def hidden_positions(self, original: Document) -> set[tuple[int, int]]:
        """Positions inside touched parts: findings there are the schema's to report."""
        positions: set[tuple[int, int]] = set()
        for table in (original.positions, original.value_positions):
            for path, at in table.items():
                if any(path[: len(t)] == t for t in self.touched):
                    positions.add(at)
        return positions

    def echoed_rules(self) -> frozenset[str]:
        """Rules whose findings would only repeat that a touched key is missing."""
        keys = {f"{t[0]}.*" if len(t) == 2 and t[0] in NAMED_SECTIONS else str(t[-1]) for t in self.touched if t}
        return frozenset().union(*(_ECHOED_RULES.get(k, frozenset()) for k in keys))


def accepted_parts(doc: Document, rejected: Iterable[YamlPath], validate: Validate) -> Accepted | None:
    """`doc` without the parts the schema rejected; None when too little is left to check
    (the states section itself, or the imports, whose names every other part may use)."""
    data = copy.deepcopy(doc.data)
    if not isinstance(data, dict):
        return None
    touched: list[YamlPath] = []
    pending = list(rejected)
    found = list(pending)  # every rejected node, removed or not (a state without an action)
    for _ in range(_MAX_ROUNDS):
        removed = [p for p in (_remove(data, path) for path in pending) if p is not None]
        if any(p[:1] == ("imports",) or p == ("states",) for p in removed):
            return None
        touched += [p for p in removed if p not in touched]
        touched += [p for p in _stand_ins(data) if p not in touched]
        # Removing a node can make its owner invalid (a required key gone): go again.
        pending = [p for p in validate(replace(doc, data=data)) if _removable(p)]
        found += pending
        if not pending:
            break
    graph_complete = not any(not t or t[0] in _GRAPH_INPUTS for t in touched + found)
    return Accepted(replace(doc, data=data), tuple(touched), graph_complete)


def _removable(path: YamlPath) -> bool:
    """Findings on a whole named entry (a state without an action, a bad name) or on the
    root leave nothing smaller to remove; stand-ins or the entry as written cover them."""
    if not path:
        return False
    return not (path[0] in NAMED_SECTIONS and len(path) == 2)


def _remove(data: dict[str, Any], path: YamlPath) -> YamlPath | None:
    """Delete the node at `path`, or the key holding the list it is in: list items are never
    removed alone, which would shift the indexes positions are recorded under. Returns the
    path removed, or None when nothing is removed here."""
    first_index = next((i for i, part in enumerate(path) if isinstance(part, int)), len(path))
    target = path[:first_index]
    if not _removable(target):
        return None
    if target == ("states",):
        return target  # nothing is left to check: the caller gives up
    owner: Any = data
    for key in target[:-1]:
        owner = owner.get(key) if isinstance(owner, dict) else None
    if not isinstance(owner, dict) or target[-1] not in owner:
        return None
    del owner[target[-1]]
    return target


def _stand_ins(data: dict[str, Any]) -> list[YamlPath]:
    """Neutral values where building the model needs one; their paths count as touched."""
    touched: list[YamlPath] = []
    for section in NAMED_SECTIONS:
        entries = data.get(section)
        if section in data and not isinstance(entries, dict):
            data[section] = {}
            touched.append((section,))
            continue
        for name, entry in (entries or {}).items():
            fixed = _entry_stand_in(section, entry)
            if fixed is not None:
                entries[name] = fixed
                touched.append((section, name))
    states = data.get("states") or {}
    for key, value in (("name", "loop"), ("start", next(iter(states), ""))):
        if not isinstance(data.get(key), str):
            data[key] = value
            touched.append((key,))
    return touched


def _entry_stand_in(section: str, entry: Any) -> Any:
    """A replacement for an entry the model cannot be built from, or None if it can."""
    if section == "models":
        if isinstance(entry, dict) and isinstance(entry.get("model"), str):
            return None
        kept = dict(entry) if isinstance(entry, dict) else {}
        return {**kept, "model": ""}
    if section == "gates":
        if isinstance(entry, str):
            return None
        if isinstance(entry, dict) and any(k in entry for k in ("shell", "expr", "json_schema", "builtin", "ref")):
            return None
        return dict(_STAND_IN_GATE)
    return None if isinstance(entry, dict) or (section == "inputs" and entry is None) else {}
