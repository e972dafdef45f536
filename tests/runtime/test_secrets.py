from __future__ import annotations

import base64
import json
from urllib.parse import quote

import pytest

from loopdsl.runtime.redaction import REDACTED, Redactor, find_secrets

SECRET = "s3cr3t-Value!"


def test_redacts_every_occurrence() -> None:
    redact = Redactor([SECRET])
    assert redact(f"a {SECRET} b {SECRET}") == f"a {REDACTED} b {REDACTED}"


def test_ignores_empty_values_and_leaves_text_alone() -> None:
    redact = Redactor(["", SECRET])
    assert redact("nothing here") == "nothing here"
    assert not Redactor([""])
    assert Redactor([""])("x y") == "x y"


def test_longest_secret_wins_where_two_overlap() -> None:
    redact = Redactor(["abcd", "abcdefgh"])
    # With the short one first the tail "efgh" of the long secret would stay visible.
    assert redact("xx abcdefgh yy abcd") == f"xx {REDACTED} yy {REDACTED}"


def test_secret_with_regex_metacharacters() -> None:
    value = "a.b*c+(d)[e]$"
    redact = Redactor([value])
    assert redact(f"-> {value} <-") == f"-> {REDACTED} <-"
    assert redact("aXbbbc+(d)[e]$") == "aXbbbc+(d)[e]$"


@pytest.mark.parametrize(
    "encode",
    [
        lambda v: json.dumps(v)[1:-1],
        lambda v: quote(v, safe=""),
        lambda v: base64.b64encode(v.encode()).decode(),
    ],
    ids=["json", "percent", "base64"],
)
def test_redacts_common_encodings(encode) -> None:  # type: ignore[no-untyped-def]
    value = 'pa"ss w/rd\n'
    encoded = encode(value)
    assert encoded != value
    assert Redactor([value])(f"log: {encoded} end") == f"log: {REDACTED} end"


def test_redact_obj_walks_nested_structures_without_mutating() -> None:
    redact = Redactor([SECRET])
    event = {"state": "x", "result": {"stdout": f"t={SECRET}", "list": [SECRET, 3, None, (SECRET,)]},
             SECRET: True}
    cleaned = redact.redact_obj(event)
    assert cleaned == {"state": "x", "result": {"stdout": f"t={REDACTED}", "list": [REDACTED, 3, None, (REDACTED,)]},
                       REDACTED: True}
    assert event["result"]["stdout"] == f"t={SECRET}"  # type: ignore[index]
    assert SECRET not in json.dumps(cleaned)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("key id AKIAIOSFODNN7EXAMPLE here", "AWS access key id"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AWS secret access key"),
        ("GH=ghp_" + "a1B2" * 9, "GitHub token"),
        ("token github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "GitHub token"),
        ("OPENAI_API_KEY sk-proj-" + "Ab1" * 12, "OpenAI-style API key"),
        ("anthropic sk-ant-api03-" + "xY9_" * 10, "Anthropic API key"),
        ("slack xoxb-123456789012-abcdefABCDEF", "Slack token"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE...", "private key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "private key"),
        ('password = "hunter2!"', "literal credential assigned to `password`"),
        ('{"api_key": "abcd1234efgh"}', "literal credential assigned to `api_key`"),
        ("DB_PASSWORD=Tr0ub4dor&3", "literal credential assigned to `DB_PASSWORD`"),
    ],
)
def test_find_secrets_patterns(text: str, kind: str) -> None:
    found = find_secrets(text)
    assert any(kind in f for f in found), found


@pytest.mark.parametrize(
    "text",
    [
        "Follow the password reset instructions in the email.",
        "Password: see the vault",
        "max_tokens: 1500\ntokens: 100000",
        "secrets: [GITHUB_TOKEN]",
        "password = get_password()",
        "password = os.environ['DB_PASSWORD']",
        "token: str",
        'password = "${DB_PASSWORD}"',
        "api_key: {{ secrets.KEY }}",
        'password = "********"',
        "password = self.settings.password",
        "The task-runner uses sk-learn for clustering.",
        "ghp_short",
        "",
    ],
)
def test_find_secrets_ignores_ordinary_text(text: str) -> None:
    assert find_secrets(text) == []


def test_find_secrets_reports_line_and_kind_but_never_the_value() -> None:
    token = "ghp_" + "Z9y8" * 9
    known = "correct horse battery staple"
    text = f"line one\nuse {token}\nthe phrase is {known}\n"
    found = find_secrets(text, known=[known, ""])
    assert found == ["GitHub token on line 2", "the value of a declared secret on line 3"]
    joined = " ".join(found)
    assert token not in joined and known not in joined and "Z9y8" not in joined


def test_find_secrets_sees_an_encoded_known_secret() -> None:
    known = "tops3cret-value"
    encoded = base64.b64encode(known.encode()).decode()
    assert find_secrets(f"Authorization: Basic {encoded}", known=[known]) == [
        "the value of a declared secret on line 1"
    ]


# ---------------------------------------------------------------- encodings (docs/dsl.md, secret rules 5)

TOKEN = "tok-9Qz/Lm+4Xr\"Wv7"


@pytest.mark.parametrize("prefix", ["", "u", "us", "user:", "Bearer:x"])
@pytest.mark.parametrize("suffix", ["", "!", ":more-bytes"])
@pytest.mark.parametrize("alphabet", [None, b"-_"], ids=["standard", "urlsafe"])
def test_base64_of_a_longer_string_is_redacted_at_every_alignment(prefix: str, suffix: str, alphabet: bytes | None) -> None:
    encoded = base64.b64encode(f"{prefix}{TOKEN}{suffix}".encode(), altchars=alphabet).decode()
    shown = Redactor([TOKEN])(f"Authorization: Basic {encoded}")
    assert REDACTED in shown
    # What is left are at most the few characters that also encode the bytes around the secret.
    assert len(shown) - len("Authorization: Basic ") - len(REDACTED) <= len(encoded) - 4 * len(TOKEN) // 3 + 2


@pytest.mark.parametrize("width", [76, 64, 60, 13])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_line_wrapped_base64_and_hex_are_redacted(width: int, newline: str) -> None:
    for offset in range(3):
        stream = base64.b64encode(("p" * (30 + offset) + TOKEN + "s" * 50).encode()).decode()
        wrapped = newline.join(stream[i:i + width] for i in range(0, len(stream), width))
        assert REDACTED in Redactor([TOKEN])(wrapped)
    hexed = TOKEN.encode().hex()
    wrapped_hex = newline.join(hexed[i:i + width] for i in range(0, len(hexed), width))
    assert Redactor([TOKEN])(f"x {wrapped_hex} y") == f"x {REDACTED} y"


@pytest.mark.parametrize("encode", [
    lambda v: v.encode().hex(), lambda v: v.encode().hex().upper(), lambda v: repr(v)[1:-1],
    lambda v: quote(v, safe="").replace("%20", "+"),
], ids=["hex", "HEX", "repr", "plus"])
def test_more_encodings(encode) -> None:  # type: ignore[no-untyped-def]
    value = "it's a p\\ss w0rd"
    assert Redactor([value])(f"<{encode(value)}>") == f"<{REDACTED}>"


def test_short_base64_runs_are_left_alone_in_ordinary_text() -> None:
    # A 4-character secret's base64 inside another stream is only a few characters long:
    # hiding every such run would eat ordinary base64 data.
    text = base64.b64encode(b"xx1234yy").decode()
    assert Redactor(["1234"])(text) == text


def test_error_messages_lose_any_run_of_eight_characters_of_a_secret() -> None:
    long = "L0ng-" + "Kq8vT2mZ" * 12
    redact = Redactor([long])
    quoted = f"fromjson: not valid JSON: {long[:80]!r}"
    assert long[:80] in redact(quoted)  # the ordinary redactor sees no whole secret there
    cleaned = redact.error(quoted)
    assert cleaned == f"fromjson: not valid JSON: '{REDACTED}'"
    assert redact.error(f"middle {long[30:45]} end") == f"middle {REDACTED} end"
    assert redact.error("short Kq8vT2m only") == "short Kq8vT2m only"  # 7 characters: kept


def test_redactor_values_are_what_a_child_inherits() -> None:
    assert set(Redactor(["b", "", "aa", "b"]).values) == {"aa", "b"}


def test_text_printed_outside_a_run_is_redacted_with_every_secret_the_process_read() -> None:
    from loopdsl.runtime.redaction import redact_printed, remember

    value = "printed-Zx81Qw0-secret"
    assert redact_printed(f"error: {value[:12]}") == f"error: {value[:12]}"  # not read yet
    remember([value, ""])
    assert redact_printed(f"error: {value} / {value[:12]}") == f"error: {REDACTED} / {REDACTED}"


@pytest.mark.parametrize("disguised", [
    "&#115;&#51;&#99;&#114;&#51;&#116;-value-9f8e7d6c", "&#115;3cr3t-value-9f8e7d6c", "s3cr3t<b></b>-value-9f8e7d6c",
    "s3cr3t-val\nue-9f8e7d6c", "s3cr3t-val  \nue-9f8e7d6c", "s3cr3t\u200b-value-9f8e7d6c", "S3CR3T-VALUE-9F8E7D6C",
])
def test_find_secrets_sees_a_value_that_would_show_whole_on_a_page(disguised: str) -> None:
    """Published text is read on a rendered page: an entity, an empty tag, an invisible
    character or a line break inside a secret hid it from the scan, not from the reader."""
    secret = "s3cr3t-value-9f8e7d6c"
    found = find_secrets(f"leak: {disguised}", [secret])
    assert found and all(secret not in f for f in found) and "disguised" in found[0]


def test_the_loose_comparison_spares_short_values_and_ordinary_text() -> None:
    assert find_secrets("the key is ab cd", ["abcd"]) == []  # too short to compare without spaces
    assert find_secrets("a value of nine chars, split: s3cr3t-val ue", ["s3cr3t-value-9f8e7d6c"]) == []
