"""Checking run inputs against a loop's `inputs:` declarations before anything runs."""
from __future__ import annotations

from typing import Any, Mapping

from . import bounded_json
from .errors import LoopdslError
from .model import InputSpec, Loop


class InputError(LoopdslError):
    """A wrong run input; exit 2."""


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


def parse_text(spec: InputSpec, text: str) -> Any:
    """A `--input k=v` string -> the declared type."""
    kind = spec.type
    try:
        if kind == "string":
            return text
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
        if kind == "boolean":
            lowered = text.strip().lower()
            if lowered in ("true", "yes", "1", "on"):
                return True
            if lowered in ("false", "no", "0", "off"):
                return False
            raise ValueError(text)
        value = bounded_json.loads(text)
        return value
    except bounded_json.JsonLimitError as exc:  # JSON, but past a bound: say which
        raise InputError(f"input '{spec.name}': {exc}",
                         f"pass a smaller {kind} as --input {spec.name}=<{kind}>") from None
    except ValueError:
        raise InputError(
            f"input '{spec.name}' must be {_article(kind)} {kind}, got {_shown(text)}",
            f"pass it as --input {spec.name}=<{kind}>" + (" (JSON)" if kind in ("array", "object") else ""),
        ) from None


def _shown(value: object) -> str:
    """A value as an error message shows it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def check_value(spec: InputSpec, value: Any) -> Any:
    types = _PY_TYPES.get(spec.type, (object,))
    ok = isinstance(value, types) and not (spec.type in ("integer", "number") and isinstance(value, bool))
    shown = _shown(value)
    if not ok:
        got = "null" if value is None else f"{type(value).__name__} {shown}"
        raise InputError(f"input '{spec.name}' must be {_article(spec.type)} {spec.type}, got {got}",
                         f"pass it as --input {spec.name}=<{spec.type}>, or as {_article(spec.type)} {spec.type} in --inputs")
    if spec.enum is not None and value not in spec.enum:
        raise InputError(f"input '{spec.name}' must be one of {', '.join(map(str, spec.enum))}, got {shown}",
                         f"e.g. --input {spec.name}={spec.enum[0]}" if spec.enum else "")
    if spec.minimum is not None and value < spec.minimum:
        raise InputError(f"input '{spec.name}' must be at least {spec.minimum}, got {shown}",
                         f"give a value from {spec.minimum}" + (f" to {spec.maximum}" if spec.maximum is not None else ""))
    if spec.maximum is not None and value > spec.maximum:
        raise InputError(f"input '{spec.name}' must be at most {spec.maximum}, got {shown}",
                         (f"give a value from {spec.minimum} to " if spec.minimum is not None else "give at most ")
                         + str(spec.maximum))
    return list(value) if isinstance(value, tuple) else value


def check_file_values(loop: Loop, given: Mapping[str, Any], source: str) -> None:
    """The values an --inputs file gives, each checked on its own, so an error names the file."""
    for name, value in given.items():
        spec = loop.inputs.get(name)
        try:
            if spec is None:
                coerce_inputs(loop, {name: value})  # the unknown-name error, with its suggestion
            else:
                check_value(spec, value)
        except InputError as exc:
            raise InputError(f"{source}: {exc.message}", exc.hint) from None


def coerce_inputs(loop: Loop, given: Mapping[str, Any], strings: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Typed values (`given`) and `--input` strings (`strings`) -> the run's inputs, defaults filled."""
    values: dict[str, Any] = {}
    raw = dict(given)
    for name, text in (strings or {}).items():
        spec = loop.inputs.get(name)
        if spec is not None:
            raw[name] = parse_text(spec, text)
        else:
            raw[name] = text
    unknown = sorted(set(raw) - set(loop.inputs))
    if unknown:
        import difflib

        name = unknown[0]
        close = difflib.get_close_matches(name, list(loop.inputs), n=1)
        accepted = ", ".join(loop.inputs) or "none"
        if not name:
            raise InputError("an --input has no name before its '='", f"write --input NAME=VALUE; inputs it accepts: {accepted}")
        raise InputError(
            f"loop '{loop.name}' has no input '{name}'" + (f"; did you mean '{close[0]}'?" if close else ""),
            f"inputs it accepts: {accepted}",
        )
    for name, spec in loop.inputs.items():
        if name in raw:
            values[name] = check_value(spec, raw[name])
        elif spec.has_default:
            values[name] = spec.default
        elif spec.required:
            raise InputError(f"input '{name}' is required", f"pass --input {name}=<{spec.type}>")
        else:
            values[name] = None
    return values
