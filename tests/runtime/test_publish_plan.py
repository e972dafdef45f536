"""Planning `publish:`: rendering with values as data, caps, validation and the secret scan."""
from __future__ import annotations

from typing import Any

import pytest

from loopdsl.language.publish_model import build_publish
from loopdsl.language.templates import compile_template
from loopdsl.runtime.publish import (BODY_LIMIT, TITLE_LIMIT, ZWJ, PublishError, marker, neutralise,
                                     plan_items)

WORKTREE = {"branch": "loopdsl/r1", "commit": "a" * 40}


def plan(raw: dict[str, Any], context: dict[str, Any] | None = None, secrets: tuple[str, ...] = (),
         worktree: dict[str, Any] = WORKTREE) -> list[dict[str, Any]]:
    publish = build_publish(raw)
    assert publish is not None
    return plan_items(publish, context or {}, secrets, "r1", worktree)


@pytest.mark.parametrize("hostile, inert", [
    ("ping @alice and @org/team", f"ping @{ZWJ}alice and @{ZWJ}org/team"),
    ("closes #12", f"c{ZWJ}loses #12"),
    ("Fixes: #3", f"F{ZWJ}ixes: #3"),
    ("RESOLVED octo/widgets#9", f"R{ZWJ}ESOLVED octo/widgets#9"),
    ("fix https://github.com/o/r/issues/4", f"f{ZWJ}ix https://github.com/o/r/issues/4"),
    ("<!-- hidden -->", f"<{ZWJ}!-- hidden -->"),
])
def test_neutralise_breaks_what_github_acts_on(hostile: str, inert: str) -> None:
    assert neutralise(hostile) == inert
    assert neutralise(inert) == inert  # a resumed plan is never broken twice


@pytest.mark.parametrize("plain", ["fix the bug in #3's parser", "closes the file", "user@ example", "#12 closes"])
def test_neutralise_leaves_ordinary_words(plain: str) -> None:
    assert neutralise(plain) == plain


def test_template_text_keeps_its_keywords_values_lose_theirs() -> None:
    reply = {"text": "@bob closes #7", "json": {"items": ["fixes #8", "@carol"]}}
    [pr] = plan({"pull_request": {"title": "Fixes #{{ inputs.n }}: {{ fix.text }}",
                                  "body": "Closes #{{ inputs.n }}\n{% for i in fix.json['items'] %}- {{ i }}\n{% endfor %}"
                                          "{{ 'closes #99' }} {{ fix.json }}"}},
                {"inputs": {"n": 5}, "fix": reply})
    assert pr["title"] == f"Fixes #5: @{ZWJ}bob c{ZWJ}loses #7"
    body = pr["body"]
    assert body.startswith("Closes #5\n") and f"- f{ZWJ}ixes #8\n- @{ZWJ}carol\n" in body
    assert "closes #99" in body  # a constant in the template is the template's own text
    assert f"@{ZWJ}carol" in body.split("closes #99")[1]  # a printed mapping is a value too
    assert body.endswith(f"\n\n{marker('r1', 'pull_request')}\n")
    assert pr["branch"] == "loopdsl/r1" and pr["commit"] == "a" * 40 and pr["fixed"] is False


def test_what_values_make_together_or_with_the_templates_text_is_broken_too() -> None:
    """Each printed value was made inert alone: a model's list printed by a `for` rebuilt a live
    mention, closing keyword and hidden comment from harmless pieces (`@` then `octocat`)."""
    pieces = {"spaced": ["cc", "@", "Closes", "#7", "<!", "--"], "joined": ["cc @", "octocat ", "<!", "-- hidden -->"],
              "keyword": "please close"}
    [comment] = plan({"comment": {"on": "issue", "number": "7", "body":
                                  "A: {% for t in r.spaced %}{{ t }} {% endfor %}\nB: {% for t in r.joined %}{{ t }}{% endfor %}\n"
                                  "C: {{ r.keyword }} #7\nD: Fixes #{{ n }} and cc @{{ who }}"}},
                     {"r": pieces, "n": 5, "who": "alice"})
    body = comment["body"]
    assert f"A: cc @ C{ZWJ}loses #7 <! --" in body  # `<! --` hides nothing
    assert f"B: cc @{ZWJ}octocat <{ZWJ}!-- hidden -->" in body
    assert f"C: please c{ZWJ}lose #7" in body  # the keyword is the value's, the reference the template's
    assert "D: Fixes #5 and cc @alice" in body  # the template's own keyword and `@`, filled in by values
    assert "\ue000" not in body and "\ue001" not in body


def test_titles_are_one_line_and_capped_bodies_are_capped() -> None:
    [pr, issue] = plan({"pull_request": {"title": "{{ t }}", "body": "{{ b }}", "branch": "bots/fix"},
                        "issue": {"title": "x", "body": "{{ b }}"}},
                       {"t": "line one\nline two " + "y" * 400, "b": "z" * (BODY_LIMIT * 2)})
    assert "\n" not in pr["title"] and len(pr["title"]) == TITLE_LIMIT and pr["title"].endswith("…")
    assert len(pr["body"].encode()) < BODY_LIMIT + 200 and "truncated" in pr["body"]
    assert pr["fixed"] is True and pr["branch"] == "bots/fix"
    assert issue["title"] == "x"


def test_numbers_labels_and_references() -> None:
    items = plan({"comment": {"on": "issue", "number": "{{ inputs.issue }}", "body": "hi"},
                  "labels": {"on": "issue", "number": 4, "add": ["bug", "{{ kind }}", "bug"], "remove": ["triage"]},
                  "review": {"event": "REQUEST_CHANGES", "body": "no", "number": "{{ inputs.pr }}"}},
                 {"inputs": {"issue": 12, "pr": " 7 "}, "kind": "security"})
    comment, labels, review = items
    assert (comment["number"], labels["number"], review["number"]) == (12, 4, 7)
    assert labels["add"] == ["bug", "security"] and labels["remove"] == ["triage"]
    assert review["event"] == "REQUEST_CHANGES" and review["body"].startswith("no\n")


def test_every_problem_is_reported_and_nothing_is_planned() -> None:
    with pytest.raises(PublishError) as info:
        plan({"pull_request": {"title": "{{ empty }}", "body": "{{ missing.text }}"},
              "comment": {"on": "issue", "number": "{{ n }}", "body": "ok"},
              "labels": {"on": "issue", "number": "0", "add": ["{{ long }}", "a\nb"]}},
             {"empty": "  ", "n": "twelve; DROP", "long": "l" * 51}, worktree={})
    message = info.value.message
    assert message.startswith("publish: nothing was written to GitHub: ")
    for part in ("pull_request.title rendered empty", "pull_request.body: undefined",
                 "the run has no branch", "comment.number rendered 'twelve; DROP'", "labels.number rendered '0'",
                 "labels.add[0] rendered", "labels.add[1] rendered"):
        assert part in message, part
    assert info.value.exit_code == 6 and "loopdsl resume r1 --force" in info.value.hint


def test_secrets_and_credential_shapes_are_refused_without_being_quoted() -> None:
    token = "ghp_" + "A1b2C3d4" * 5
    with pytest.raises(PublishError) as info:
        plan({"issue": {"title": "report", "body": "{{ a }}\n{{ b }}"}},
             {"a": "the key is hunter2-very-secret", "b": f"and {token}"}, secrets=("hunter2-very-secret",))
    message = info.value.message
    assert "issue.body holds the value of a declared secret on line 1" in message
    assert "issue.body holds GitHub token on line 2" in message
    assert "hunter2" not in message and token not in message


def test_the_publish_sandbox_is_the_loop_sandbox() -> None:
    with pytest.raises(PublishError, match="issue.title: blocked by the template sandbox"):
        plan({"issue": {"title": "{{ ''.__class__.__mro__ }}"}})
    # values_as_data is scoped to a publish render: other templates print values unchanged
    assert compile_template("{{ x }}").render({"x": "@alice closes #1"}) == "@alice closes #1"



def test_a_run_that_changed_nothing_proposes_nothing() -> None:
    raw = {"pull_request": {"title": "t"}, "review": {"event": "COMMENT", "body": "b"},
           "comment": {"on": "issue", "number": 3, "body": "nothing to fix"}}
    items = plan(raw, worktree={"branch": "loopdsl/r1", "commit": None})
    assert [i["kind"] for i in items] == ["comment"]  # the pull request and its review are left out
    assert [i["kind"] for i in plan(raw)] == ["pull_request", "comment", "review"]
