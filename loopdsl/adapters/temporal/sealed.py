"""Secrets on Temporal: workflow code only ever holds a secret's name.

A declared secret renders as a placeholder (`@@loopdsl-secret:SEAL:NAME@@`) in workflow code,
so the activity inputs the history keeps carry the name, never the value. The activity
that runs a command puts the value in (read by name from its worker's environment) and
redacts it from what it returns, as the local backend redacts a run's records. A prompt
may not use a secret on this backend: the model call would have to send it, so the
request the history keeps would hold it.

The seal is the Temporal run's id, which nothing given to the run at its start can know: an
input, a reply or an event payload that holds placeholder-like text (`@@loopdsl-secret:
GITHUB_TOKEN@@`) stays that text, as on the local backend, and only the loop's own declared
names are ever put in (a hostile input once read any variable of the worker into a command).
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping

_PLACEHOLDER = re.compile(r"@@loopdsl-secret:([0-9A-Za-z-]{1,64}):([A-Za-z_][A-Za-z0-9_]*)@@")


def placeholders(names: Iterable[str], seal: str) -> dict[str, str]:
    """`Ports.secret_values` for the workflow: each declared name -> its placeholder."""
    return {name: f"@@loopdsl-secret:{seal}:{name}@@" for name in names}


def named_in(texts: Iterable[str], seal: str | None = None) -> set[str]:
    """The names of the placeholders in `texts` (of this `seal` only, when given)."""
    return {m.group(2) for text in texts for m in _PLACEHOLDER.finditer(text) if seal is None or m.group(1) == seal}


def unseal(value: str, seal: str, allowed: Iterable[str], environ: Mapping[str, str] = os.environ) -> str:
    """`value` with each placeholder of this `seal` naming an `allowed` (declared) secret replaced
    by the secret from this worker's environment (empty when unset, as the local backend passes
    an unset declared secret); any other text, placeholder-like or not, is left as it is."""
    names = set(allowed)

    def value_of(match: re.Match[str]) -> str:
        if match.group(1) != seal or match.group(2) not in names:
            return match.group(0)
        return environ.get(match.group(2), "")

    return _PLACEHOLDER.sub(value_of, value)


def values_for(names: Iterable[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    return {name: environ[name] for name in names if environ.get(name)}


def redactor(values: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> Any:
    """What an activity's results are redacted of: the secrets it was given, and the undeclared
    credentials of this worker's environment (a command of the same user can read them)."""
    from ...runtime.redaction import Redactor, ambient_credentials

    return Redactor([*values.values(), *ambient_credentials(environ, values)])
