"""Secrets on Temporal: workflow code only ever holds a secret's name.

A declared secret renders as a placeholder (`@@loopdsl-secret:NAME@@`) in workflow code,
so the activity inputs the history keeps carry the name, never the value. The activity
that runs a command puts the value in (read by name from its worker's environment) and
redacts it from what it returns, as the local backend redacts a run's records. A prompt
may not use a secret on this backend: the model call would have to send it, so the
request the history keeps would hold it.
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping

_PLACEHOLDER = re.compile(r"@@loopdsl-secret:([A-Za-z_][A-Za-z0-9_]*)@@")


def placeholders(names: Iterable[str]) -> dict[str, str]:
    """`Ports.secret_values` for the workflow: each declared name -> its placeholder."""
    return {name: f"@@loopdsl-secret:{name}@@" for name in names}


def named_in(texts: Iterable[str]) -> set[str]:
    return {m.group(1) for text in texts for m in _PLACEHOLDER.finditer(text)}


def unseal(value: str, environ: Mapping[str, str] = os.environ) -> str:
    """`value` with each placeholder replaced by the secret from this worker's environment
    (empty when unset, as the local backend passes an unset declared secret)."""
    return _PLACEHOLDER.sub(lambda m: environ.get(m.group(1), ""), value)


def values_for(names: Iterable[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    return {name: environ[name] for name in names if environ.get(name)}


def redactor(values: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> Any:
    """What an activity's results are redacted of: the secrets it was given, and the undeclared
    credentials of this worker's environment (a command of the same user can read them)."""
    from ...runtime.redaction import Redactor, ambient_credentials

    return Redactor([*values.values(), *ambient_credentials(environ, values)])
