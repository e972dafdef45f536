from __future__ import annotations

import base64
import json
from urllib.parse import quote

import pytest

from loopdsl.secrets import REDACTED, Redactor, find_secrets

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
