"""A run's inputs as its record keeps them: a declared secret's value given as an input
(`-i token=$DEPLOY_TOKEN`) is stored as a placeholder naming the secret, and put back from
the environment when the run resumes, so the value never reaches the store while the
resumed run renders what the first process rendered.

The placeholder carries the run's seal, a random value kept in the record's meta: an input
written to look like a placeholder (an issue title, a model's text passed along) cannot
know it, so it stays text on resume instead of becoming a secret.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

from .redaction import map_strings

_PLACEHOLDER = re.compile(r"@@loopdsl-input-secret:([0-9a-f]{32}):([A-Za-z_][A-Za-z0-9_]*)@@")


def new_seal() -> str:
    return os.urandom(16).hex()


def seal_inputs(inputs: Any, secrets: Mapping[str, str], seal: str) -> Any:
    """`inputs` with each declared secret's value (longest first) replaced by its placeholder."""
    values = sorted(((value, name) for name, value in secrets.items() if value), key=lambda pair: -len(pair[0]))
    if not values or not seal:
        return inputs

    def sealed(text: str) -> str:
        for value, name in values:
            text = text.replace(value, f"@@loopdsl-input-secret:{seal}:{name}@@")
        return text

    return map_strings(inputs, sealed)


def unseal_inputs(inputs: Any, secrets: Mapping[str, str], seal: str | None) -> Any:
    """`inputs` with this seal's placeholders of declared secrets replaced by their values
    (empty when the resuming process lacks one, as a command gets an unset secret)."""
    if not seal:
        return inputs

    def value_of(match: re.Match[str]) -> str:
        if match.group(1) != seal or match.group(2) not in secrets:
            return match.group(0)
        return secrets[match.group(2)]

    return map_strings(inputs, lambda text: _PLACEHOLDER.sub(value_of, text))
