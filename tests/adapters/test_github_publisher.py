"""A publish plan applied by the GitHub publisher to the loopback fake: each kind of write,
references between them, a resumed plan that finds its earlier writes, and failures."""
from __future__ import annotations

from typing import Any

import pytest

from github_fake import FakeGitHub
from loopdsl.adapters.github.publisher import GitHubPublisher
from loopdsl.language.publish_model import build_publish
from loopdsl.runtime.publish import PublishError, plan_items
from loopdsl.runtime.publish_apply import apply_plan, publish_pending, record_plan
from loopdsl.runtime.run_state import RunState

pytest.importorskip("githubkit")

RAW = {"issue": {"title": "Flaky: {{ t }}", "body": "seen in {{ t }}", "labels": ["flaky"]},
       "comment": {"on": "issue", "body": "triaged by @{{ who }}"},
       "labels": {"on": "issue", "add": ["ci"], "remove": ["flaky", "absent"]}}


@pytest.fixture
def fake():
    with FakeGitHub() as server:
        yield server


class Recorder:
    """The run's log as apply_plan sees it: events emitted, commits made (with the plan then)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.commits: list[list[Any]] = []

    def emit(self, type_: str, **data: Any) -> None:
        self.events.append((type_, data))

    def commit(self) -> None:
        self.commits.append(list(self.state.meta["publish"]["results"]))


def planned(raw: dict[str, Any], context: dict[str, Any]) -> RunState:
    state = RunState(run_id="r1", loop="l", start="a", status="completed")
    publish = build_publish(raw)
    assert publish is not None
    record_plan(state, plan_items(publish, context, (), "r1", {}))
    return state


def publisher(fake: FakeGitHub, token: str | None = None) -> GitHubPublisher:
    env = {"GITHUB_API_URL": fake.url, "GITHUB_REPOSITORY": fake.repository, "GITHUB_TOKEN": token or fake.token}
    return GitHubPublisher("GITHUB_TOKEN", None, env)


def test_issue_comment_and_labels_go_to_the_issue_this_publish_opens(fake: FakeGitHub) -> None:
    state = planned(RAW, {"t": "test_io", "who": "dana"})
    log = Recorder(state)
    apply_plan(state, publisher(fake), log.emit, log.commit)

    assert not publish_pending(state)
    [issue] = fake.state.issues.values()
    assert issue["title"] == "Flaky: test_io" and "<!-- loopdsl:r1:issue -->" in issue["body"]
    [comment] = fake.state.comments
    # the template's own `@` is a mention it declares; the value after it is printed as it is
    assert comment["issue_number"] == issue["number"] and comment["body"].startswith("triaged by @dana")
    assert fake.state.labels[issue["number"]] == ["ci"]
    kinds = [(k, d.get("kind")) for k, d in log.events]
    assert kinds == [("publish_intent", "issue"), ("published", "issue"), ("publish_intent", "comment"),
                     ("published", "comment"), ("publish_intent", "labels"), ("published", "labels")]
    # committed before each write (no result yet) and after it (its result)
    assert [sum(r is not None for r in c) for c in log.commits] == [0, 1, 1, 2, 2, 3, 3]


def test_a_resumed_plan_finds_what_the_killed_process_wrote(fake: FakeGitHub) -> None:
    state = planned(RAW, {"t": "x", "who": "y"})
    first = Recorder(state)
    apply_plan(state, publisher(fake), first.emit, first.commit)
    # As if the process died after the comment was written, before its result was recorded:
    record = state.meta["publish"]
    record["results"][1:] = [None, None]
    record["status"] = "planned"
    writes = len(fake.writes)
    again = Recorder(state)
    apply_plan(state, publisher(fake), again.emit, again.commit)
    assert len(fake.state.comments) == 1 and len(fake.state.issues) == 1
    assert [d["action"] for k, d in again.events if k == "published"] == ["found", "labelled"]
    # labels again: idempotent (the removed labels answer 404, which is "already removed")
    assert [w.method for w in fake.writes[writes:]] == ["POST"] and fake.state.labels[1] == ["ci"]


def test_review_of_a_numbered_pull_request_and_a_rate_limit_on_the_way(fake: FakeGitHub) -> None:
    fake.state.pulls[5] = {"number": 5, "state": "open", "head": {"ref": "feature"}, "title": "t", "body": "",
                           "html_url": "https://github.example/octo/widgets/pull/5"}
    state = planned({"review": {"number": "{{ n }}", "event": "REQUEST_CHANGES", "body": "{{ text }}"}},
                    {"n": 5, "text": "please add a test, @lead"})
    fake.rate_limit(times=1, status=429, retry_after=1)
    log = Recorder(state)
    apply_plan(state, publisher(fake), log.emit, log.commit)
    [review] = fake.state.reviews
    assert review["state"] == "CHANGES_REQUESTED" and "@\u200dlead" in review["body"]
    assert len(fake.writes_to("POST", r"/pulls/5/reviews$")) == 1


def test_a_failed_write_is_recorded_and_the_rest_waits_for_resume(fake: FakeGitHub) -> None:
    state = planned(RAW, {"t": "x", "who": "y"})
    log = Recorder(state)
    with pytest.raises(PublishError, match=r"publish issue: GitHub: opening an issue failed with HTTP 401") as info:
        apply_plan(state, publisher(fake, token="wrong"), log.emit, log.commit)
    assert "check the token in GITHUB_TOKEN" in info.value.hint and "loopdsl resume r1" in info.value.hint
    assert info.value.exit_code == 6
    assert state.meta["publish"]["status"] == "failed" and publish_pending(state)
    assert log.events[-1][0] == "publish_failed" and fake.writes == []
    apply_plan(state, publisher(fake), log.emit, log.commit)  # the resume, with the right token
    assert not publish_pending(state) and len(fake.state.issues) == 1
    # its intent was recorded, so the issue was looked for by its marker first (none: the 401 wrote nothing)
    assert [d["action"] for k, d in log.events if k == "published"] == ["created", "created", "labelled"]
    assert any(r.method == "GET" and r.path.endswith("/issues") for r in fake.requests)
