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
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping
from urllib.parse import quote, quote_plus

REDACTED = "***"

# Below this length an encoded form (base64, percent-encoding) is too likely to occur by
# chance in ordinary text; the raw value is still always redacted.
_MIN_ENCODED_LENGTH = 4
# A base64 run of fewer characters than this, cut out of a longer stream (the secret at
# offset 1 or 2 of a 3-byte group), matches ordinary base64 data too often to be redacted.
_MIN_EMBEDDED_BASE64 = 6
# Encoders wrap base64 and hex at 76 (MIME), 64 (PEM) or 60 (xxd -p) columns: a line break
# may stand between any two characters of those forms.
_WRAP = r"(?:\r?\n)?"
# Error messages quote values cut short (Python's `int()` at 200 characters of repr, our
# `fromjson` at 80): any run of this many characters of a secret is hidden in them.
_FRAGMENT = 8


def _embedded_base64(data: bytes, alphabet: bytes | None) -> set[str]:
    """The base64 characters that encode `data` wherever it stands in a longer stream.

    A string such as `user:TOKEN` puts the secret at any offset modulo 3 of the encoder's
    3-byte groups; each offset gives a different text. For each, only the characters
    whose 6 bits come wholly from `data` are kept (the others depend on the bytes around
    it), so the form is found inside `Basic base64(user:TOKEN)` at any alignment.
    """
    forms: set[str] = set()
    n = len(data)
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + data, altchars=alphabet).decode("ascii")
        first = -(-8 * offset // 6)  # ceil: the first character not touching the prefix
        last = 8 * (offset + n) // 6  # the first character that needs bits after `data`
        core = encoded[first:last]
        if offset == 0 or len(core) >= _MIN_EMBEDDED_BASE64:
            forms.add(core)
    forms.add(base64.b64encode(data, altchars=alphabet).decode("ascii"))  # standalone, with its padding
    return forms


def secret_variants(value: str) -> set[str]:
    """The forms in which a secret value commonly leaks into text, found literally.

    The raw value; its escaped form inside a JSON string (a value with quotes, backslashes
    or newlines is printed that way by `json.dumps` and most loggers) and inside a Python
    repr (exception messages); its percent-encodings (URLs, form bodies). The forms that
    may be line-wrapped (base64, hex) are in `wrapped_variants`.
    """
    variants = {value}
    if len(value) >= _MIN_ENCODED_LENGTH:
        variants.add(json.dumps(value)[1:-1])
        variants.add(json.dumps(value, ensure_ascii=False)[1:-1])
        variants.add(repr(value)[1:-1])
        variants.add(quote(value, safe=""))
        variants.add(quote_plus(value, safe=""))
    variants.discard("")
    return variants


def wrapped_variants(value: str) -> set[str]:
    """Base64 (standard and URL-safe alphabets, at every alignment, see `_embedded_base64`)
    and hex (lower and upper case) of a secret's UTF-8 bytes. They are matched with an
    optional line break between any two characters."""
    if len(value) < _MIN_ENCODED_LENGTH:
        return set()
    data = value.encode("utf-8")
    forms = _embedded_base64(data, None) | _embedded_base64(data, b"-_")
    forms |= {data.hex(), data.hex().upper()}
    forms.discard("")
    return forms


def _wrappable(form: str) -> str:
    return _WRAP.join(re.escape(c) for c in form)


class Redactor:
    """Replaces every occurrence of the given secret values (and their common encodings,
    see `secret_variants` and `wrapped_variants`) with ``***``. Empty values are ignored.
    The longest form wins where two overlap, so a secret that contains another is hidden whole."""

    def __init__(self, secret_values: Iterable[str]):
        self._values = tuple(sorted({v for v in secret_values if isinstance(v, str) and v}, key=len, reverse=True))
        literal: set[str] = set()
        wrapped: set[str] = set()
        for value in self._values:
            literal |= secret_variants(value)
            wrapped |= wrapped_variants(value)
        wrapped -= literal
        forms = [(v, re.escape(v)) for v in literal] + [(v, _wrappable(v)) for v in wrapped]
        forms.sort(key=lambda pair: (-len(pair[0]), pair[0]))
        # Wrapped forms may span line breaks: a match can be up to this much longer.
        self._longest = max((len(v) + 2 * (len(v) // 32 + 2) for v, _ in forms), default=0)
        # Python's alternation takes the first alternative that matches at a position,
        # so listing the longest first makes overlapping secrets redact whole.
        self._pattern = re.compile("|".join(p for _, p in forms)) if forms else None
        self._fragments = {v[i:i + _FRAGMENT] for v in self._values for i in range(max(len(v) - _FRAGMENT + 1, 0))}

    @property
    def longest(self) -> int:
        """Length in characters of the longest form redacted (0 when there are none).

        Output capture keeps this many bytes (times 4, for UTF-8) past its cap so a secret
        straddling the cap is still recognised whole before the text is cut."""
        return self._longest

    @property
    def values(self) -> tuple[str, ...]:
        """The secret values this redactor hides (a child loop's redactor inherits them)."""
        return self._values

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def cut(self, text: str, end: int) -> str:
        """`text[:end]`, redacted, with a secret that starts before `end` hidden whole: for a
        capture cut short, whose `text` runs at least `longest` characters past `end` (its
        very end may hold the start of a secret, which a plain redaction would leave)."""
        if self._pattern is None:
            return text[:end]
        kept: list[str] = []
        last = 0
        for match in self._pattern.finditer(text):
            if match.start() >= end:
                break
            kept += [text[last:match.start()], REDACTED]
            last = match.end()
        if last < end:
            kept.append(text[last:end])
        return "".join(kept)

    def error(self, text: str) -> str:
        """Redact an error message: every form `__call__` hides, and also any run of 8 or
        more characters of a secret (a message may quote a value cut short, or a part of
        it). Too strict for ordinary output, where such runs occur by chance; an error
        message is short and losing a few characters of it costs nothing."""
        text = self(text)
        if not self._fragments or len(text) < _FRAGMENT:
            return text
        hidden = bytearray(len(text))
        for i in range(len(text) - _FRAGMENT + 1):
            if text[i:i + _FRAGMENT] in self._fragments:
                hidden[i:i + _FRAGMENT] = b"\1" * _FRAGMENT
        if not any(hidden):
            return text
        out: list[str] = []
        for i, ch in enumerate(text):
            if not hidden[i]:
                out.append(ch)
            elif i == 0 or not hidden[i - 1]:
                out.append(REDACTED)
        return "".join(out)

    def redact_obj(self, obj: Any) -> Any:
        """A copy of `obj` with secrets redacted in every string, mapping key included,
        inside dicts, lists and tuples. Other values are returned as they are. Walks without
        recursion: a hostile value's nesting depth cannot crash the redactor."""
        if self._pattern is None:
            return obj
        return map_strings(obj, self)


def map_strings(value: Any, change: Any) -> Any:
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


# Every secret value this process has read (api.secret_values): the last line of defence
# for text printed outside a run's own redactor (an internal error, a usage error).
_READ: set[str] = set()


# Names of environment variables that hold credentials (also kept away from commands): a name
# containing one of the words, or the short ones (GITHUB_PAT, SMTP_PASS, DB_PW) as a whole part.
CREDENTIAL_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|COOKIE"
                             r"|(?:^|_)(?:PAT|PASS|PW)(?:_|$)", re.IGNORECASE)
# A URL that carries a password (`postgres://user:pw@host/db`), whatever its variable's name.
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@")


def is_credential(name: str, value: str) -> bool:
    """Whether an environment variable holds a credential, by its name or its value."""
    return bool(CREDENTIAL_NAME.search(name) or _URL_WITH_PASSWORD.search(value))


# An undeclared credential's value is hidden like a declared secret's only when it looks like
# one: long enough, and not a path or a word list (SSH_AUTH_SOCK, XAUTHORITY and AUTH_MODE=none
# hold nothing secret, and hiding them would garble ordinary output).
_AMBIENT_MIN_LENGTH = 8


def ambient_credentials(environ: Mapping[str, str], declared: Iterable[str]) -> tuple[str, ...]:
    """The values of this process's credential variables a loop did not declare. Commands never
    get them (`api.run_environment.command_environment`), but a command of the same user can still read
    them (`/proc/<loopdsl's pid>/environ`), and a model may be handed one: they are redacted
    from everything the run stores and prints, as declared secrets are."""
    skip = set(declared)
    return tuple(sorted({value for name, value in environ.items()
                         if name not in skip and len(value) >= _AMBIENT_MIN_LENGTH and not value.startswith("/")
                         and not any(c.isspace() for c in value) and is_credential(name, value)}))


def without_own_credentials(text: str) -> str:
    """What a person typed (a decision's comment) cleared of the credentials of this process's
    own environment, and of any run of 8 characters of one: a process that records a decision
    read no loop's secrets, but a CI job's token or a provider key may be pasted."""
    return Redactor(ambient_credentials(os.environ, ())).error(text)


def remember(values: Iterable[str]) -> None:
    _READ.update(v for v in values if isinstance(v, str) and v)


def redact_printed(text: str) -> str:
    """`text` with every secret this process has read redacted, as an error message."""
    return Redactor(_READ).error(text) if _READ else text


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


def hide_credentials(text: str) -> str:
    """`text` with every credential shape (AWS, GitHub, OpenAI/Anthropic, Slack, PEM) as `***`."""
    for pattern in _CREDENTIAL_PATTERNS:
        text = pattern.regex.sub("***", text)
    return text


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
    if redactor and not any(kind == "the value of a declared secret" for _, kind in found):
        shown = _as_shown(text)
        for value in redactor.values:
            if len(value) >= _DISGUISE_MIN and _as_shown(value) in shown:
                add(0, "the value of a declared secret, disguised (entities, tags, invisible characters or line breaks)")
                break
    found.sort()
    return [f"{kind} on line {line}" if line else kind for line, kind in found]


# What a reader sees of a text on a rendered page, for finding a secret written so that it
# shows whole there while its bytes differ: `&#115;3cr3t`, `s3cr<b></b>3t`, a zero-width space
# inside it, or a line break in the middle. Compared without case or spaces; values shorter than
# this are not compared so loosely (they would match by chance).
_DISGUISE_MIN = 8
_TAG = re.compile(r"<[^<>]{0,200}>")


def _as_shown(text: str) -> str:
    import html  # deferred: only a publish's scan needs it
    import unicodedata

    text = _TAG.sub("", html.unescape(_TAG.sub("", text)))
    return "".join(c for c in text.casefold() if not c.isspace() and unicodedata.category(c) != "Cf")
