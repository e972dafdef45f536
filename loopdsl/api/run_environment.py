"""What a run's commands get of loopdsl's environment, and what the run hides of it.

Declared secrets are read by name; a command gets one only through its own `env:`. Variables
that look like credentials (`runtime.redaction.is_credential`) never reach a command unless
declared, and their values are redacted from the run's records anyway: a command of the same
user can read loopdsl's own environment from /proc.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

from ..language.model import Loop
from ..runtime.redaction import ambient_credentials, is_credential, remember
from .store_access import UsageError

# The headers of an OTLP exporter carry the tracing back end's API key (Honeycomb's, Grafana
# Cloud's): loopdsl's exporter uses them, a loop's commands never see them.
_OTLP_HEADERS = re.compile(r"OTEL_EXPORTER_OTLP(_[A-Z]+)?_HEADERS", re.IGNORECASE)


def command_environment(loop: Loop, secret_values: Mapping[str, str], workdir: Path) -> dict[str, str]:
    # Environment variables that look like credentials reach commands only when declared as `secrets`.
    env = {k: v for k, v in os.environ.items()
           if not is_credential(k, v) and not k.startswith("LOOPDSL_") and not _OTLP_HEADERS.fullmatch(k)}
    env.update(secret_values)
    env["LOOPDSL_WORKDIR"] = str(workdir)
    return env


MIN_SECRET_LENGTH = 4


def secret_values(loop: Loop) -> dict[str, str]:
    values = {name: os.environ[name] for name in loop.secrets if os.environ.get(name)}
    short = sorted(name for name, value in values.items() if len(value) < MIN_SECRET_LENGTH)
    if short:
        # Hiding every occurrence of a one- to three-character value would garble every text
        # the run writes (field names included) while protecting nothing a guess would not find.
        raise UsageError(
            f"secret {', '.join(short)} has fewer than {MIN_SECRET_LENGTH} characters: loopdsl cannot "
            "keep so short a value out of its output",
            "set the variable to the real secret value, or remove it from the loop's `secrets:`")
    remember(values.values())
    return values


def ambient_credentials_of_run(secrets: Mapping[str, str]) -> tuple[str, ...]:
    """The credentials of this process's environment the loop does not declare, redacted from
    the run's records and from what the CLI prints (`redaction.ambient_credentials`)."""
    ambient = ambient_credentials(os.environ, secrets)
    remember(ambient)
    return ambient
