"""Keeping secrets out of everything loopdsl shows or stores.

Two jobs, both pure functions of text:
- `Redactor` replaces the values of declared secrets with ``***`` in captured output,
  events and results before they leave the engine (trace, store, terminal, prompts).
- `find_secrets` backs the `no_secrets` gate: it reports declared secret values and
  common credential shapes found in a text, describing each by kind and line, never
  quoting it (the description becomes model feedback and is stored).
"""
from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable
from urllib.parse import quote

REDACTED = "***"

# Below this length an encoded form (base64, percent-encoding) is too likely to occur by
# chance in ordinary text; the raw value is still always redacted.
_MIN_ENCODED_LENGTH = 4


def secret_variants(value: str) -> set[str]:
    """The forms in which a secret value commonly leaks into text.

    The raw value; its escaped form inside a JSON string (a value with quotes, backslashes
    or newlines is printed that way by `json.dumps` and most loggers); its percent-encoding
    (URLs, form bodies); and its standalone base64 (HTTP Basic auth, Kubernetes secrets).
    A base64 of a longer string that merely contains the secret is not recognisable and is
    not covered.
    """
    variants = {value}
    if len(value) >= _MIN_ENCODED_LENGTH:
        variants.add(json.dumps(value)[1:-1])
        variants.add(json.dumps(value, ensure_ascii=False)[1:-1])
        variants.add(quote(value, safe=""))
        encoded = base64.b64encode(value.encode("utf-8")).decode("ascii")
        variants.add(encoded)
        # A secret embedded in a longer base64 stream often appears without its padding.
        variants.add(encoded.rstrip("="))
    variants.discard("")
    return variants


class Redactor:
    """Replaces every occurrence of the given secret values (and their common encodings,
    see `secret_variants`) with ``***``. Empty values are ignored. The longest variant wins
    where two overlap, so a secret that contains another is hidden whole."""

    def __init__(self, secret_values: Iterable[str]):
        variants: set[str] = set()
        for value in secret_values:
            if isinstance(value, str) and value:
                variants |= secret_variants(value)
        self._variants = tuple(sorted(variants, key=lambda v: (-len(v), v)))
        # Python's alternation takes the first alternative that matches at a position,
        # so listing the longest first makes overlapping secrets redact whole.
        self._pattern = re.compile("|".join(re.escape(v) for v in self._variants)) if self._variants else None

    @property
    def longest(self) -> int:
        """Length in characters of the longest form redacted (0 when there are none).

        Output capture keeps this many bytes (times 4, for UTF-8) past its cap so a secret
        straddling the cap is still recognised whole before the text is cut."""
        return len(self._variants[0]) if self._variants else 0

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def redact_obj(self, obj: Any) -> Any:
        """A copy of `obj` with secrets redacted in every string, mapping key included,
        inside dicts, lists and tuples. Other values are returned as they are. Walks without
        recursion: a hostile value's nesting depth cannot crash the redactor."""
        if self._pattern is None:
            return obj
        return _map_strings(obj, self)


def _map_strings(value: Any, change: Any) -> Any:
    """A copy of `value` with `change` applied to every string (keys too), iteratively."""
    containers = (dict, list, tuple)
    if not isinstance(value, containers):
        return change(value) if isinstance(value, str) else value
    # Each frame: the container, an iterator over its children, the converted children so far.
    stack: list[tuple[Any, Any, list[Any]]] = [(value, iter(_items(value)), [])]
    while True:
        original, children, converted = stack[-1]
        for child in children:
            if isinstance(child, containers):
                stack.append((child, iter(_items(child)), []))
                break
            converted.append(change(child) if isinstance(child, str) else child)
        else:
            stack.pop()
            if isinstance(original, dict):
                built: Any = {(change(k) if isinstance(k, str) else k): v
                              for k, v in zip(original.keys(), converted)}
            else:
                built = type(original)(converted) if isinstance(original, tuple) else converted
            if not stack:
                return built
            stack[-1][2].append(built)


def _items(container: Any) -> Any:
    return container.values() if isinstance(container, dict) else container


# ---------------------------------------------------------------- secret scanning


@dataclass(frozen=True)
class _CredentialPattern:
    kind: str
    regex: re.Pattern[str]


# Shapes published by each issuer; the bounds keep them from firing on prose.
_CREDENTIAL_PATTERNS: tuple[_CredentialPattern, ...] = (
    _CredentialPattern(
        "private key (PEM header)",
        re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
    ),
    _CredentialPattern(
        "AWS access key id", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Z0-9])")
    ),
    _CredentialPattern(
        "AWS secret access key",
        re.compile(r"(?i)aws_?secret_?access_?key[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
    ),
    _CredentialPattern(
        "GitHub token", re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})")
    ),
    _CredentialPattern(
        "Anthropic API key", re.compile(r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{20,}")
    ),
    _CredentialPattern(
        "OpenAI-style API key (sk-...)",
        re.compile(r"(?<![A-Za-z0-9_-])sk-(?!ant-)(?:[A-Za-z0-9]+-)*[A-Za-z0-9_]{20,}"),
    ),
    _CredentialPattern("Slack token", re.compile(r"(?<![A-Za-z0-9])xox[abposre]-[A-Za-z0-9-]{10,}")),
)

# `password = "..."`, `"api_key": "..."`, `DB_PASSWORD=...`: a name ending in a credential
# word, an assignment, and a literal value.
_ASSIGNMENT = re.compile(
    r"""(?ix)
    (?<![A-Za-z0-9_])
    (?P<name>[A-Za-z0-9_.-]*?(?:password|passwd|pwd|passphrase|secret|secret_key|api_?key|
        access_?key|auth_?token|access_?token|private_?key|client_?secret|token))
    ["']?\s*(?::=|=|:)\s*
    (?:
        (?P<quote>["'])(?P<quoted>[^"'\n]*)(?P=quote)
      | (?P<bare>[^\s"'`,;)\]}]+)
    )
    """
)
_PLACEHOLDER = re.compile(
    r"""^(?:
        [$%{<] .*                 # ${VAR}, %(x)s, {{ x }}, <your-password>
      | [*x.X•-]+                 # ****, xxxx, ...
      | (?i:changeme|password|secret|example|redacted|none|null|true|false|todo|tbd)
    )$""",
    re.VERBOSE,
)


def _looks_like_literal_secret(value: str, quoted: bool) -> bool:
    if _PLACEHOLDER.match(value):
        return False
    if quoted:
        return len(value) >= 4
    # Unquoted values are usually code (`password = get_password()`, `token: str`); count
    # only those shaped like a credential: long enough, with a letter and a digit or symbol.
    if len(value) < 6 or "(" in value or "[" in value:
        return False
    has_letter = any(c.isalpha() for c in value)
    has_other = any(c.isdigit() or not (c.isalnum() or c == "_") for c in value)
    return has_letter and has_other and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+", value)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def find_secrets(text: str, known: Iterable[str] = ()) -> list[str]:
    """Describe the secrets found in `text`: each declared value in `known` (and its common
    encodings) and each credential shape (AWS, GitHub, OpenAI/Anthropic, Slack, PEM private
    keys, literal `password = ...` assignments). One description per kind and line, e.g.
    ``"GitHub token on line 3"``; the secret itself is never included."""
    found: list[tuple[int, str]] = []
    seen: set[tuple[int, str]] = set()

    def add(line: int, kind: str) -> None:
        if (line, kind) not in seen:
            seen.add((line, kind))
            found.append((line, kind))

    redactor = Redactor(known)
    if redactor:
        assert redactor._pattern is not None
        for match in redactor._pattern.finditer(text):
            add(_line_of(text, match.start()), "the value of a declared secret")
    for pattern in _CREDENTIAL_PATTERNS:
        for match in pattern.regex.finditer(text):
            add(_line_of(text, match.start()), pattern.kind)
    for match in _ASSIGNMENT.finditer(text):
        quoted = match.group("quote") is not None
        value = match.group("quoted") if quoted else match.group("bare")
        if value is not None and _looks_like_literal_secret(value, quoted):
            add(_line_of(text, match.start()), f"a literal credential assigned to `{match.group('name')}`")
    found.sort()
    return [f"{kind} on line {line}" for line, kind in found]
