"""The interpreter end to end, in process: every state kind, routing, retries, gates,
feedback, visits, timeouts, budgets and the run context, each through `loopdsl.run`.

Loop logic is driven either by the scripted provider (a reply script; no LiteLLM) or, where
a test must see the prompts the engine sends, by a small capturing provider object given as
`provider=`.
Shell states run real bash in a tmp workdir.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest

import loopdsl
from loopdsl.language.diagnostics import LoopError
from loopdsl.language.model import build_loop
from loopdsl.runtime.model_port import LlmRequest, LlmResponse, ProviderError

HEADER = """\
loopdsl: 1
name: engine-test
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 100}
"""
REPO_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- helpers


class CapturingProvider:
    """A provider port that records every request and answers from per-state queues.

    A queue item is reply text, a ProviderError to raise, or ("sleep", seconds) to hang.
    """

    def __init__(self, replies: Mapping[str, Sequence[Any]], prompt_tokens: int = 30, completion_tokens: int = 5):
        self.replies = {state: list(items) for state, items in replies.items()}
        self.requests: list[tuple[str, LlmRequest]] = []
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens

    async def complete(self, request: LlmRequest, *, state: str) -> LlmResponse:
        self.requests.append((state, request))
        reply = self.replies[state].pop(0)
        if isinstance(reply, ProviderError):
            raise reply
        if isinstance(reply, tuple) and reply[0] == "sleep":
            await asyncio.sleep(reply[1])
            reply = "late"
        return LlmResponse(text=reply, prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                           cost_usd=None, model=request.model)

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int:
        return 40

    def prompts(self, state: str) -> list[str]:
        return [req.messages[-1]["content"] for s, req in self.requests if s == state]

    def systems(self, state: str) -> list[str]:
        return [req.messages[0]["content"] for s, req in self.requests if s == state and req.messages[0]["role"] == "system"]


class RecordingHuman:
    def __init__(self, answer: dict[str, Any] | None):
        self.answer = answer
        self.asked: list[tuple[str, str, tuple[str, ...]]] = []

    async def decide(self, state: str, message: str, choices: tuple[str, ...]) -> dict[str, Any] | None:
        self.asked.append((state, message, choices))
        return self.answer


def write_loop(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "loop.yaml"
    path.write_text(header + textwrap.dedent(body), encoding="utf-8")
    return path


def write_script(tmp_path: Path, replies: Mapping[str, Any]) -> Path:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(replies), encoding="utf-8")
    return path


def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return work


def run(tmp_path: Path, body: str, *, header: str = HEADER, replies: Mapping[str, Any] | None = None,
        **kwargs: Any) -> loopdsl.RunResult:
    loop = write_loop(tmp_path, body, header)
    if replies is not None:
        kwargs["script"] = write_script(tmp_path, replies)
    return loopdsl.run(loop, workdir=workdir(tmp_path), **kwargs)


def events(result: loopdsl.RunResult, type_: str, state: str | None = None) -> list[dict[str, Any]]:
    return [e for e in result.events if e["type"] == type_ and (state is None or e.get("state") == state)]


# ---------------------------------------------------------------- state kinds


def test_shell_state_result_runs_in_workdir(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: sh
        states:
          sh:
            shell: {cmd: "echo out; echo err >&2; pwd > where.txt; exit 3", ok_exit: [3]}
            next: done
          done: {end: completed}
        """)
    assert result.status == "completed", result.state.error
    sh = result.state.results["sh"]
    assert (sh["stdout"], sh["stderr"], sh["exit_code"], sh["ok"]) == ("out\n", "err\n", 3, True)
    assert sh["duration_s"] >= 0
    assert (workdir(tmp_path) / "where.txt").read_text().strip() == str(workdir(tmp_path).resolve())
    assert result.exit_code == 0


def test_shell_exit_outside_ok_exit_fails_with_kind_shell_exit(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: sh
        states:
          sh: {shell: "echo boom >&2; exit 7", next: done}
          done: {end: completed}
        """)
    assert result.status == "failed"
    assert result.state.error["kind"] == "shell_exit"
    assert "7" in result.state.error["message"] and "boom" in result.state.error["message"]
    assert result.exit_code == 1


def test_llm_text_output_has_null_json_and_usage(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: ask
        states:
          ask: {llm: {model: m, prompt: "Say hi"}, next: done}
          done: {end: completed, output: {said: "{{ ask.text }}"}}
        """, replies={"ask": [{"text": '{"looks": "like json"}', "usage": {"prompt_tokens": 12, "completion_tokens": 4}}]})
    assert result.status == "completed"
    ask = result.state.results["ask"]
    assert ask["text"] == '{"looks": "like json"}'
    assert ask["json"] is None
    assert ask["usage"] == {"prompt_tokens": 12, "completion_tokens": 4}
    # gpt-4o-mini from LiteLLM's price table: $0.15 / $0.60 per million tokens
    assert ask["cost_usd"] == pytest.approx((12 * 0.15 + 4 * 0.60) / 1e6, rel=1e-9)
    assert result.tokens == 16
    assert result.outputs == {"said": '{"looks": "like json"}'}


def test_llm_json_strips_one_fence_and_schema_mismatch_is_a_parse_retry(tmp_path: Path) -> None:
    body = """\
        start: plan
        states:
          plan:
            llm:
              model: m
              prompt: "Plan. {{ feedback }}"
              schema: {type: object, required: [n], properties: {n: {type: integer}}}
            retry: {max_attempts: 3, backoff: {initial: 0s}}
            next: done
          done: {end: completed}
        """
    provider = CapturingProvider({"plan": ["not json at all", '```json\n{"x": 1}\n```', '```json\n{"n": 3}\n```']})
    result = run(tmp_path, body, provider=provider)
    assert result.status == "completed", result.state.error
    assert result.state.results["plan"]["json"] == {"n": 3}
    assert [e["kind"] for e in events(result, "retry", "plan")] == ["parse", "parse"]
    prompts = provider.prompts("plan")
    assert prompts[0] == "Plan. "
    assert "not valid JSON" in prompts[1]
    assert "does not match the schema" in prompts[2] and "'n' is a required property" in prompts[2]
    # the schema is given to the model in the system message
    assert '"required": ["n"]' in provider.systems("plan")[0]


def test_evaluate_accept_and_reject_route_and_criteria_reach_system(tmp_path: Path) -> None:
    body = """\
        start: draft
        states:
          draft:
            llm: {model: m, prompt: "Write. {{ feedback }}"}
            max_visits: 3
            next: review
          review:
            evaluate:
              model: m
              prompt: "Judge: {{ draft.text }}"
              criteria: [Is short, Is polite]
            max_visits: 3
            transitions:
              - {to: done, when: "review.verdict == 'accept'"}
              - {to: draft}
          done: {end: completed, output: {verdict: "{{ review.verdict }}"}}
        """
    provider = CapturingProvider({
        "draft": ["v1", "v2"],
        "review": ['{"verdict": "reject", "feedback": "be shorter"}', '{"verdict": "accept", "feedback": "fine"}'],
    })
    result = run(tmp_path, body, provider=provider)
    assert result.status == "completed", result.state.error
    assert result.path == ["draft", "review", "draft", "review", "done"]
    assert result.outputs == {"verdict": "accept"}
    # a reject is a result, never a failure: no retry, no failed event
    assert not events(result, "retry") and not events(result, "failed")
    assert provider.prompts("draft") == ["Write. ", "Write. be shorter"]
    assert provider.prompts("review") == ["Judge: v1", "Judge: v2"]
    system = provider.systems("review")[0]
    assert "- Is short" in system and "- Is polite" in system and '"verdict"' in system


def test_evaluate_reply_that_is_not_a_verdict_is_a_parse_failure_and_retried(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: review
        states:
          review:
            evaluate: {model: m, prompt: "Judge"}
            retry: {max_attempts: 2, backoff: {initial: 0s}}
            transitions:
              - {to: done, when: "review.verdict == 'accept'"}
              - {to: done}
          done: {end: completed}
        """, replies={"review": ['{"verdict": "maybe"}', '{"verdict": "accept", "feedback": "ok"}']})
    assert result.status == "completed", result.state.error
    assert [e["kind"] for e in events(result, "retry")] == ["parse"]
    assert result.state.results["review"]["verdict"] == "accept"


def test_a_verdict_named_twice_is_a_parse_failure_not_its_last_key(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: review
        states:
          review:
            evaluate: {model: m, prompt: "Judge"}
            retry: {max_attempts: 1, backoff: {initial: 0s}}
            transitions:
              - {to: done, when: "review.verdict == 'accept'"}
              - {to: done}
          done: {end: completed}
        """, replies={"review": ['{"verdict": "reject", "feedback": "no", "verdict": "accept"}']})
    assert result.status == "failed", result.state.results.get("review")  # it was taken as accept
    assert result.state.error["kind"] == "parse"
    assert "names 'verdict' twice" in result.state.error["message"]


def test_set_strings_are_expressions_other_scalars_literals(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        inputs:
          who: {type: string, default: world}
        start: calc
        states:
          calc:
            set:
              sum: "1 + 2"
              greeting: "'hello ' ~ inputs.who"
              count: 7
              ratio: 2.5
              flag: true
              nothing: null
            next: done
          done: {end: completed}
        """)
    assert result.status == "completed", result.state.error
    calc = result.state.results["calc"]
    assert {k: calc[k] for k in ("sum", "greeting", "count", "ratio", "flag", "nothing")} == {
        "sum": 3, "greeting": "hello world", "count": 7, "ratio": 2.5, "flag": True, "nothing": None}


def test_checkpoint_with_scripted_decision_routes_on_it(tmp_path: Path) -> None:
    body = """\
        start: approve
        states:
          approve:
            checkpoint: {message: "Ship it?"}
            transitions:
              - {to: shipped, when: "approve.decision == 'approve'"}
              - {to: rejected}
          shipped: {end: completed, output: {comment: "{{ approve.comment }}", by: "{{ approve.by }}"}}
          rejected: {end: failed}
        """
    result = run(tmp_path, body, replies={"approve": [{"decision": "approve", "comment": "lgtm"}]})
    assert result.status == "completed"
    assert result.outputs == {"comment": "lgtm", "by": "script"}
    assert result.state.results["approve"]["at"]
    rejected = run(tmp_path, body, replies={"approve": [{"decision": "reject", "comment": "no"}]})
    assert rejected.status == "failed" and rejected.path[-1] == "rejected" and rejected.exit_code == 1


def test_checkpoint_without_decision_waits_exit_4(tmp_path: Path) -> None:
    human = RecordingHuman(None)
    result = run(tmp_path, """\
        start: prep
        states:
          prep: {shell: "echo ready", next: approve}
          approve:
            checkpoint: {message: "Status {{ prep.stdout | trim }}; ship?"}
            transitions:
              - {to: shipped, when: "approve.decision == 'approve'"}
              - {to: rejected}
          shipped: {end: completed}
          rejected: {end: failed}
        """, human=human)
    assert result.status == "waiting"
    assert result.exit_code == 4
    assert human.asked == [("approve", "Status ready; ship?", ("approve", "reject"))]
    waiting = events(result, "waiting")
    assert len(waiting) == 1 and waiting[0]["state"] == "approve"
    assert result.state.waiting["state"] == "approve"
    assert "approve" not in result.state.results  # nothing decided, nothing recorded


def test_decision_outside_choices_is_refused(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: pick
        states:
          pick:
            checkpoint: {message: "Which?", choices: [red, blue]}
            transitions:
              - {to: done, when: "pick.decision == 'red'"}
              - {to: done}
          done: {end: completed}
        """, human=RecordingHuman({"decision": "green", "by": "me"}))
    assert result.status == "failed"
    assert "green" in result.state.error["message"] and "red" in result.state.error["message"]


def test_outputs_top_level_overlaid_by_end_output_at_any_end(tmp_path: Path) -> None:
    body = """\
        inputs:
          fail: {type: boolean, default: false}
        outputs:
          greeting: "{{ hello.stdout | trim }}"
          which: top
        start: hello
        states:
          hello:
            shell: echo hi
            transitions:
              - {to: bad, when: "inputs.fail"}
              - {to: good}
          good: {end: completed, output: {which: "good end", extra: 5}}
          bad: {end: failed}
        """
    good = run(tmp_path, body)
    assert good.status == "completed"
    assert good.outputs == {"greeting": "hi", "which": "good end", "extra": 5}
    bad = run(tmp_path, body, inputs={"fail": True})
    assert bad.status == "failed"
    assert bad.outputs == {"greeting": "hi", "which": "top"}


def test_an_output_that_cannot_be_rendered_fails_a_completed_end_but_not_another(tmp_path: Path) -> None:
    # Lint cannot see this one: the value's shape is known only at run time.
    body = """\
        inputs:
          fail: {type: boolean, default: false}
        outputs:
          first: "{{ hello.json.items[0] }}"
        start: hello
        states:
          hello:
            set: {json: "{}"}
            transitions:
              - {to: bad, when: "inputs.fail"}
              - {to: good}
          good: {end: completed}
          bad: {end: escalated}
        """
    good = run(tmp_path, body)
    assert good.status == "failed"
    assert good.state.error["kind"] == "output" and "output 'first'" in good.state.error["message"]
    assert good.exit_code == 1
    bad = run(tmp_path, body, inputs={"fail": True})
    assert bad.status == "escalated" and bad.outputs == {"first": None}
    assert [e["output"] for e in events(bad, "output_error")] == ["first"]


def test_history_of_a_state_that_has_not_run_is_an_empty_list(tmp_path: Path) -> None:
    body = """\
        start: count
        states:
          count:
            set: {checks: "history.check | length"}
            max_visits: 5
            transitions:
              - {to: done, when: "count.checks >= 2"}
              - {to: check}
          check: {shell: "true", next: count}
          done: {end: completed, output: {checks: "{{ count.checks }}"}}
        """
    result = run(tmp_path, body)
    assert result.status == "completed", result.state.error
    assert [r["checks"] for r in result.state.history["count"]] == [0, 1, 2]
    assert result.outputs == {"checks": 2}


# ---------------------------------------------------------------- guards


GUARDS = """\
    inputs:
      n: {type: integer}
    start: pick
    states:
      pick:
        set: {n: "inputs.n"}
        transitions:
          - {to: big, when: "pick.n > 10"}
          - {to: medium, when: "pick.n > 1"}
          - {to: small}
      big: {end: completed, output: {size: big}}
      medium: {end: completed, output: {size: medium}}
      small: {end: completed, output: {size: small}}
    """


@pytest.mark.parametrize("n, size", [(50, "big"), (5, "medium"), (0, "small")])
def test_first_true_guard_wins_else_default(tmp_path: Path, n: int, size: str) -> None:
    # n=50 makes both guards true: the first listed wins
    result = run(tmp_path, GUARDS, inputs={"n": n})
    assert result.status == "completed"
    assert result.outputs == {"size": size}
    assert result.path == ["pick", size]


def _loop_data(states: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"loopdsl": 1, "name": "built", "models": {"m": {"model": "openai/gpt-4o-mini", "max_tokens": 100}},
            "start": next(iter(states)), "states": states, **top}


def test_no_matching_guard_fails_with_no_transition(tmp_path: Path) -> None:
    # lint refuses a transitions list without a default, so build the model directly
    loop = build_loop(_loop_data({
        "pick": {"set": {"n": "1"}, "transitions": [{"to": "done", "when": "pick.n > 5"}], "on_failure": "rescue"},
        "done": {"end": "completed"},
        "rescue": {"end": "escalated"},
    }))
    result = loopdsl.run(loop, workdir=workdir(tmp_path))
    assert result.status == "failed"
    assert result.state.error["kind"] == "no_transition"
    assert result.state.error["state"] == "pick"
    assert result.path == ["pick"]


def test_when_that_raises_fails_the_state(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: pick
        states:
          pick:
            set: {n: "0"}
            transitions:
              - {to: done, when: "10 / pick.n > 1"}
              - {to: done}
          done: {end: completed}
        """)
    assert result.status == "failed"
    assert result.state.error["state"] == "pick"
    assert "ZeroDivisionError" in result.state.error["message"] and "when" in result.state.error["message"]
    assert result.path == ["pick"]


def test_when_that_raises_fails_the_state_through_on_failure(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: pick
        states:
          pick:
            set: {n: "0"}
            on_failure: rescue
            transitions:
              - {to: done, when: "10 / pick.n > 1"}
              - {to: done}
          done: {end: completed}
          rescue: {end: escalated}
        """)
    assert result.status == "escalated"


# ---------------------------------------------------------------- retries, gates, feedback


COUNTER = 'n=$(cat {name}.count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {name}.count; '


def test_retry_counts_attempts_with_backoff_and_retry_events(tmp_path: Path) -> None:
    flaky = COUNTER.format(name="flaky") + 'echo "attempt $n" >&2; [ "$n" -ge 3 ]'
    result = run(tmp_path, f"""\
        start: flaky
        states:
          flaky:
            shell: {json.dumps(flaky)}
            retry: {{max_attempts: 3, backoff: {{initial: 0.1s, factor: 2, max: 10s, jitter: false}}}}
            next: done
          done: {{end: completed}}
        """)
    assert result.status == "completed", result.state.error
    retries = events(result, "retry", "flaky")
    assert [(e["attempt"], e["kind"]) for e in retries] == [(1, "shell_exit"), (2, "shell_exit")]
    assert [e["delay_s"] for e in retries] == [0.1, 0.2]
    attempts = events(result, "attempt", "flaky")
    assert [e["attempt"] for e in attempts] == [1, 2, 3]
    gaps = [datetime.fromisoformat(b["t"]) - datetime.fromisoformat(a["t"]) for a, b in zip(attempts, attempts[1:])]
    assert gaps[0].total_seconds() >= 0.09 and gaps[1].total_seconds() >= 0.19
    assert result.steps == 3  # retries use steps...
    assert result.state.visits["flaky"] == 1  # ...not visits
    assert (workdir(tmp_path) / "flaky.count").read_text().strip() == "3"


def test_attempts_run_out_goes_to_on_failure_with_error_visible(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: boom
        states:
          boom:
            shell: "echo kaput >&2; exit 9"
            retry: {max_attempts: 2, backoff: {initial: 0s}}
            on_failure: handle
            next: done
          handle:
            shell: printf '%s|%s|%s' "{{ error.kind }}" "{{ boom.error.kind }}" "{{ boom.ok }}"
            next: handled
          handled: {end: completed, output: {seen: "{{ handle.stdout }}", msg: "{{ boom.error.message }}"}}
          done: {end: completed}
        """)
    assert result.status == "completed", result.state.error
    assert result.path == ["boom", "handle", "handled"]
    assert result.outputs["seen"] == "shell_exit|shell_exit|false"  # booleans render as JSON text
    assert "exited with 9" in result.outputs["msg"] and "kaput" in result.outputs["msg"]
    assert len(events(result, "attempt", "boom")) == 2


def test_failure_without_on_failure_ends_failed(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: boom
        states:
          boom: {shell: "exit 1", next: done}
          done: {end: completed}
        """)
    assert (result.status, result.path, result.state.error["state"]) == ("failed", ["boom"], "boom")


def test_failed_after_gate_message_becomes_feedback_in_next_prompt(tmp_path: Path) -> None:
    provider = CapturingProvider({"draft": ["no good", "OK fine"]})
    result = run(tmp_path, """\
        start: draft
        states:
          draft:
            llm: {model: m, prompt: "attempt {{ run.attempt }} feedback=[{{ feedback }}]"}
            gates:
              after:
                - {expr: "'OK' in draft.text", name: says-ok}
                - name: non-empty
                  shell: test -n "{{ draft.text }}"
            retry: {max_attempts: 2, backoff: {initial: 0s}}
            next: done
          done: {end: completed}
        """, provider=provider)
    assert result.status == "completed", result.state.error
    first, second = provider.prompts("draft")
    assert first == "attempt 1 feedback=[]"
    assert second.startswith("attempt 2 feedback=[after-gate 'says-ok' failed")
    gates = [(e["gate"], e["passed"]) for e in events(result, "gate", "draft")]
    # gates stop at the first failure: attempt 1 never ran `non-empty`
    assert gates == [("says-ok", False), ("says-ok", True), ("non-empty", True)]
    assert [e["kind"] for e in events(result, "retry")] == ["gate"]


def test_failed_shell_gate_output_reaches_feedback(tmp_path: Path) -> None:
    provider = CapturingProvider({"draft": ["1", "2"]})
    result = run(tmp_path, """\
        start: draft
        states:
          draft:
            llm: {model: m, prompt: "fb=[{{ feedback }}]"}
            gates:
              after:
                - name: even
                  shell: echo "value {{ draft.text }} is odd" >&2; test "{{ draft.text }}" = 2
            retry: {max_attempts: 2, backoff: {initial: 0s}}
            next: done
          done: {end: completed}
        """, provider=provider)
    assert result.status == "completed", result.state.error
    assert "value 1 is odd" in provider.prompts("draft")[1]


def test_failed_before_gate_means_no_llm_call_and_no_tokens(tmp_path: Path) -> None:
    provider = CapturingProvider({"draft": ["never"]})
    result = run(tmp_path, """\
        start: draft
        states:
          draft:
            llm: {model: m, prompt: "hi"}
            gates:
              before: [{shell: "test -f needed.txt", name: has-input}]
            retry: {max_attempts: 2, backoff: {initial: 0s}}
            next: done
          done: {end: completed}
        """, provider=provider)
    assert result.status == "failed"
    assert result.state.error["kind"] == "gate" and "has-input" in result.state.error["message"]
    assert provider.requests == []
    assert (result.tokens, result.cost_usd) == (0, 0.0)
    assert result.steps == 2  # each failed before-gate used up an attempt
    assert not events(result, "llm")


def test_retry_on_limits_which_kinds_retry(tmp_path: Path) -> None:
    body = """\
        start: ask
        states:
          ask:
            llm: {model: m, prompt: "hi"}
            retry: {max_attempts: 3, on: [rate_limit], backoff: {initial: 0s}}
            next: done
          done: {end: completed}
        """
    retried = run(tmp_path, body, replies={"ask": [{"error": "rate_limit"}, {"error": "rate_limit"}, "ok"]})
    assert retried.status == "completed"
    assert [e["kind"] for e in events(retried, "retry")] == ["rate_limit", "rate_limit"]
    not_retried = run(tmp_path, body, replies={"ask": [{"error": "server_error"}, "never used"]})
    assert not_retried.status == "failed"
    assert not_retried.state.error["kind"] == "server_error"
    assert not events(not_retried, "retry") and len(events(not_retried, "attempt")) == 1


def test_default_retry_on_skips_auth_and_context_window(tmp_path: Path) -> None:
    body = """\
        start: ask
        states:
          ask:
            llm: {model: m, prompt: "hi"}
            retry: {max_attempts: 3, backoff: {initial: 0s}}
            next: done
          done: {end: completed}
        """
    for kind in ("auth", "context_window"):
        result = run(tmp_path, body, replies={"ask": [{"error": kind}, "never"]})
        assert (result.status, result.state.error["kind"], len(events(result, "attempt"))) == ("failed", kind, 1)
    for kind in ("timeout", "server_error", "connection"):
        result = run(tmp_path, body, replies={"ask": [{"error": kind}, "fine"]})
        assert result.status == "completed" and [e["kind"] for e in events(result, "retry")] == [kind]


def test_scripted_errors_are_charged_like_real_ones(tmp_path: Path) -> None:
    """docs/dsl.md: scripted `timeout` and `connection` (a dropped connection) are charged the
    whole reservation; the error statuses nothing."""
    body = """\
        start: ask
        states:
          ask:
            llm: {model: m, prompt: "hi", max_tokens: 100}
            retry: {max_attempts: 2, backoff: {initial: 0s}, on: [timeout, connection, server_error, rate_limit]}
            next: done
          done: {end: completed}
        """
    ok = {"text": "fine", "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
    charged = {}
    for kind in ("timeout", "connection", "server_error", "rate_limit"):
        result = run(tmp_path, body, replies={"ask": [{"error": kind}, ok]})
        assert result.status == "completed", result.state.error
        charged[kind] = result.tokens - 8
    reserved = charged["timeout"]
    assert reserved > 100  # the counted prompt + max_tokens
    assert charged == {"timeout": reserved, "connection": reserved, "server_error": 0, "rate_limit": 0}


def test_history_lists_every_attempt(tmp_path: Path) -> None:
    flaky = COUNTER.format(name="h") + 'echo "try $n"; [ "$n" -ge 3 ]'
    result = run(tmp_path, f"""\
        start: flaky
        states:
          flaky:
            shell: {json.dumps(flaky)}
            retry: {{max_attempts: 3, backoff: {{initial: 0s}}}}
            next: report
          report:
            set:
              count: "history.flaky | length"
              oks: "history.flaky | map(attribute='ok') | list"
              outs: "history.flaky | map(attribute='stdout') | list"
            next: done
          done: {{end: completed}}
        """)
    assert result.status == "completed", result.state.error
    report = result.state.results["report"]
    assert report["count"] == 3
    assert report["oks"] == [False, False, True]
    assert report["outs"] == ["try 1\n", "try 2\n", "try 3\n"]
    assert len(result.state.history["flaky"]) == 3


def test_feedback_clearing_rules(tmp_path: Path) -> None:
    """Retry feedback reaches the retry only; evaluate feedback reaches the next state;
    a successful non-evaluate state that routes onward clears it."""
    provider = CapturingProvider({
        "write": ["bad", "good", "better"],
        "review": ['{"verdict": "reject", "feedback": "needs polish"}', '{"verdict": "accept", "feedback": "shiny"}'],
        "after": ["x"],
    })
    result = run(tmp_path, """\
        start: write
        states:
          write:
            llm: {model: m, prompt: "write fb=[{{ feedback }}]"}
            gates:
              after: [{expr: "write.text != 'bad'", name: not-bad}]
            retry: {max_attempts: 2, backoff: {initial: 0s}}
            max_visits: 3
            next: review
          review:
            evaluate: {model: m, prompt: "judge {{ write.text }} fb=[{{ feedback }}]"}
            max_visits: 3
            transitions:
              - {to: tidy, when: "review.verdict == 'accept'"}
              - {to: write}
          tidy: {shell: "true", next: after}
          after:
            llm: {model: m, prompt: "after fb=[{{ feedback }}]"}
            next: done
          done: {end: completed}
        """, provider=provider)
    assert result.status == "completed", result.state.error
    writes = provider.prompts("write")
    assert writes[0] == "write fb=[]"
    assert writes[1].startswith("write fb=[after-gate 'not-bad' failed")
    assert writes[2] == "write fb=[needs polish]"  # the evaluator's feedback
    reviews = provider.prompts("review")
    assert reviews == ["judge good fb=[]", "judge better fb=[]"]  # the successful write cleared it
    # review accepted with "shiny"; `tidy` succeeded and routed onward, clearing it
    assert provider.prompts("after") == ["after fb=[]"]


def test_evaluate_feedback_reaches_the_state_after_it(tmp_path: Path) -> None:
    provider = CapturingProvider({"review": ['{"verdict": "accept", "feedback": "shiny"}'], "after": ["x"]})
    result = run(tmp_path, """\
        start: review
        states:
          review:
            evaluate: {model: m, prompt: "judge"}
            transitions:
              - {to: after, when: "review.verdict == 'accept'"}
              - {to: after}
          after:
            llm: {model: m, prompt: "fb=[{{ feedback }}]"}
            next: done
          done: {end: completed}
        """, provider=provider)
    assert result.status == "completed"
    assert provider.prompts("after") == ["fb=[shiny]"]


# ---------------------------------------------------------------- visits


def test_max_visits_exhausted_entry_runs_nothing_and_goes_to_on_exhausted(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: work
        states:
          work:
            shell: echo run >> work.log
            max_visits: 2
            on_exhausted: out
            next: again
          again: {set: {x: "1"}, next: work}
          out: {end: escalated, output: {runs: "{{ history.work | length }}"}}
        """)
    assert result.status == "escalated"
    assert (workdir(tmp_path) / "work.log").read_text() == "run\nrun\n"
    assert result.path == ["work", "again", "work", "again", "work", "out"]
    exhausted = events(result, "exhausted", "work")
    assert len(exhausted) == 1 and exhausted[0]["visits"] == 3
    assert len(events(result, "attempt", "work")) == 2
    assert result.outputs == {"runs": 2}
    assert result.exit_code == 1


def test_max_visits_without_on_exhausted_ends_failed(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        start: work
        states:
          work: {shell: "echo run >> work.log", max_visits: 1, next: again}
          again:
            set: {x: "1"}
            max_visits: 5
            transitions:
              - {to: done, when: "again.x > 5"}
              - {to: work}
          done: {end: completed}
        """)
    assert result.status == "failed"
    assert result.state.error["state"] == "work"
    assert (workdir(tmp_path) / "work.log").read_text() == "run\n"


# ---------------------------------------------------------------- timeouts


def test_shell_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run(tmp_path, """\
        start: slow
        states:
          slow:
            shell: {cmd: "(sleep 1 && touch child-survived) & sleep 20; touch parent-survived", timeout: 0.3s}
            next: done
          done: {end: completed}
        """)
    elapsed = time.monotonic() - started
    assert result.status == "failed"
    assert result.state.error["kind"] == "timeout"
    assert elapsed < 5
    time.sleep(1.2)
    assert not (workdir(tmp_path) / "child-survived").exists()
    assert not (workdir(tmp_path) / "parent-survived").exists()


def test_state_timeout_kills_a_slow_shell_command(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run(tmp_path, """\
        start: slow
        states:
          slow:
            shell: "(sleep 1 && touch child-survived) & sleep 20; touch parent-survived"
            timeout: 0.3s
            on_failure: handle
            next: done
          handle: {end: escalated, output: {kind: "{{ error.kind }}"}}
          done: {end: completed}
        """)
    assert time.monotonic() - started < 5
    assert result.status == "escalated"
    assert result.outputs == {"kind": "timeout"}
    time.sleep(1.2)
    assert not (workdir(tmp_path) / "child-survived").exists()
    assert not (workdir(tmp_path) / "parent-survived").exists()


def test_state_timeout_cancels_a_slow_provider_call_and_charges_the_reservation(tmp_path: Path) -> None:
    provider = CapturingProvider({"ask": [("sleep", 10)]})
    started = time.monotonic()
    result = run(tmp_path, """\
        start: ask
        states:
          ask:
            llm: {model: m, prompt: "hi"}
            timeout: 0.3s
            next: done
          done: {end: completed}
        """, provider=provider)
    assert time.monotonic() - started < 3
    assert result.status == "failed"
    assert result.state.error["kind"] == "timeout"
    # a cancelled call may have been billed: its whole reservation (40 prompt + 100 max) is charged
    assert result.tokens == 40 + 100
    assert result.cost_usd == pytest.approx((40 * 0.15 + 100 * 0.60) / 1e6, rel=1e-9)


# ---------------------------------------------------------------- budgets


def test_steps_budget_ends_budget_exhausted_keeping_results(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        budget: {steps: 3}
        outputs: {first: "{{ s1.stdout | trim }}"}
        start: s1
        states:
          s1: {shell: "echo one", next: s2}
          s2: {shell: "echo two", next: s3}
          s3: {shell: "echo three", next: s4}
          s4: {shell: "touch s4-ran", next: done}
          done: {end: completed}
        """)
    assert result.status == "budget_exhausted"
    assert result.exit_code == 1
    assert result.steps == 3
    assert set(result.state.results) == {"s1", "s2", "s3"}
    assert result.state.results["s3"]["stdout"] == "three\n"
    assert not (workdir(tmp_path) / "s4-ran").exists()
    assert result.state.error["kind"] == "budget"
    assert result.outputs == {"first": "one"}
    assert events(result, "budget_exhausted")[0]["which"] == "steps"


def test_token_budget_refuses_a_call_that_might_not_fit(tmp_path: Path) -> None:
    provider = CapturingProvider({"a": ["x"], "b": ["never"]})
    result = run(tmp_path, """\
        budget: {tokens: 200}
        start: a
        states:
          a: {llm: {model: m, prompt: "one"}, next: b}
          b: {llm: {model: m, prompt: "two"}, next: done}
          done: {end: completed}
        """, provider=provider)
    # a reserves 40 + 100 = 140 and spends 35; b would reserve 140 more: 175 > 200? no, fits
    assert result.status == "completed", result.state.error
    provider = CapturingProvider({"a": ["x"], "b": ["never"]})
    result = run(tmp_path, """\
        budget: {tokens: 170}
        start: a
        states:
          a: {llm: {model: m, prompt: "one"}, next: b}
          b: {llm: {model: m, prompt: "two"}, next: done}
          done: {end: completed}
        """, provider=provider)
    assert result.status == "budget_exhausted"
    assert [s for s, _ in provider.requests] == ["a"]
    assert result.tokens == 35
    assert result.state.results["a"]["text"] == "x"


def test_wall_time_budget_stops_a_running_command(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run(tmp_path, """\
        budget: {wall_time: 0.5s}
        start: quick
        states:
          quick: {shell: "echo fast", next: slow}
          slow: {shell: "sleep 20; touch slow-finished", next: done}
          done: {end: completed}
        """)
    assert time.monotonic() - started < 5
    assert result.status == "budget_exhausted"
    assert result.state.results["quick"]["stdout"] == "fast\n"
    assert not (workdir(tmp_path) / "slow-finished").exists()


def test_call_max_tokens_and_alias_parameters_reach_the_provider(tmp_path: Path) -> None:
    provider = CapturingProvider({"ask": ["x"]})
    result = run(tmp_path, """\
        budget: {tokens: 50}
        start: ask
        states:
          ask: {llm: {model: warm, prompt: "hi", system: "Be brief about {{ inputs.topic }}.", max_tokens: 7}, next: done}
          done: {end: completed}
        """, header=HEADER + "  warm: {model: openai/gpt-4o-mini, max_tokens: 100, temperature: 0.9}\n"
                              "inputs: {topic: {type: string, default: owls}}\n", provider=provider)
    assert result.status == "completed", result.state.error
    (_, request), = provider.requests
    assert (request.model, request.max_tokens, request.temperature) == ("openai/gpt-4o-mini", 7, 0.9)
    assert request.messages == ({"role": "system", "content": "Be brief about owls."}, {"role": "user", "content": "hi"})
    # the reservation (40 counted + 7) fit the 50-token cap: the alias's 100 would not have
    assert result.usage["ask"]["tokens"] == 35


# ---------------------------------------------------------------- run context


def test_run_date_attempt_and_visits(tmp_path: Path) -> None:
    flaky = COUNTER.format(name="c") + 'printf "%s:%s:%s\\n" "{{ run.attempt }}" "{{ run.visits }}" "{{ run.date }}" >> ctx.log; [ "$n" -ne 1 ]'
    result = run(tmp_path, f"""\
        start: step
        states:
          step:
            shell: {json.dumps(flaky)}
            retry: {{max_attempts: 2, backoff: {{initial: 0s}}}}
            max_visits: 2
            on_exhausted: done
            next: step
          done: {{end: completed, output: {{id: "{{{{ run.id }}}}"}}}}
        """)
    assert result.status == "completed", result.state.error
    today = datetime.now(timezone.utc).date().isoformat()
    lines = (workdir(tmp_path) / "ctx.log").read_text().splitlines()
    assert lines == [f"1:1:{today}", f"2:1:{today}", f"1:2:{today}"]
    assert result.outputs == {"id": result.run_id}


def test_run_date_uses_schedule_timezone(tmp_path: Path) -> None:
    from zoneinfo import ZoneInfo

    zone = ZoneInfo("Pacific/Kiritimati")  # UTC+14: its date differs from UTC's for 14 hours a day
    before = datetime.now(zone).date().isoformat()
    result = run(tmp_path, """\
        schedule: {cron: "0 9 * * *", timezone: Pacific/Kiritimati}
        start: d
        states:
          d: {set: {date: "run.date"}, next: done}
          done: {end: completed}
        """)
    after = datetime.now(zone).date().isoformat()
    assert result.state.results["d"]["date"] in (before, after)


def test_scripted_rate_limit_retry_after_is_honoured(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run(tmp_path, """\
        start: ask
        states:
          ask:
            llm: {model: m, prompt: "hi"}
            retry: {max_attempts: 2, backoff: {initial: 0s}}
            next: done
          done: {end: completed}
        """, replies={"ask": [{"error": "rate_limit", "retry_after": 0.4}, "fine"]})
    assert result.status == "completed", result.state.error
    assert events(result, "retry")[0]["delay_s"] >= 0.4
    assert time.monotonic() - started >= 0.4


def test_budget_is_visible_to_templates(tmp_path: Path) -> None:
    result = run(tmp_path, """\
        budget: {steps: 10}
        start: a
        states:
          a: {shell: "true", next: b}
          b: {set: {spent: "budget.spent.steps", left: "budget.remaining.steps"}, next: done}
          done: {end: completed}
        """)
    assert result.status == "completed", result.state.error
    assert (result.state.results["b"]["spent"], result.state.results["b"]["left"]) == (2, 8)


# ---------------------------------------------------------------- user mistakes


def test_lint_error_raises_loop_error_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(LoopError) as info:
        run(tmp_path, """\
            start: a
            states:
              a: {shell: "touch ran", next: nowhere}
              done: {end: completed}
            """)
    assert "nowhere" in str(info.value.diagnostics)
    assert not (workdir(tmp_path) / "ran").exists()


def test_unknown_input_is_a_clear_error(tmp_path: Path) -> None:
    from loopdsl.language.inputs import InputError

    with pytest.raises(InputError, match="did you mean 'limit'"):
        run(tmp_path, """\
            inputs: {limit: {type: integer, default: 1}}
            start: a
            states:
              a: {shell: "true", next: done}
              done: {end: completed}
            """, inputs={"limt": 3})


@pytest.mark.parametrize("given, said, hint", [
    ({"color": "green"}, "must be one of red, blue, got 'green'", "e.g. --input color=red"),
    ({"color": "red", "n": 9}, "must be at most 5, got 9", "give a value from 1 to 5"),
    ({"color": "red", "n": 0}, "must be at least 1, got 0", "give a value from 1 to 5"),
    ({"color": 5}, "must be a string, got int 5", "pass it as --input color=<string>"),
    ({"color": "x" * 5000}, "got 'xxxxxxxx", "e.g. --input color=red"),
])
def test_a_wrong_input_says_how_to_fix_it(given: dict[str, Any], said: str, hint: str) -> None:
    """Out-of-range and not-a-choice inputs had no hint, and quoted a long value whole."""
    from loopdsl.language.inputs import InputError, coerce_inputs
    from loopdsl.language.model import build_loop

    loop = build_loop({"loopdsl": 1, "name": "ins", "start": "done", "states": {"done": {"end": "completed"}},
                       "inputs": {"color": {"type": "string", "enum": ["red", "blue"]},
                                  "n": {"type": "integer", "minimum": 1, "maximum": 5, "default": 2}}})
    with pytest.raises(InputError) as info:
        coerce_inputs(loop, given)
    assert said in info.value.message and info.value.hint.startswith(hint) and len(info.value.message) < 200


# ---------------------------------------------------------------- dry run


def test_dry_run_prints_plan_and_never_imports_litellm(tmp_path: Path) -> None:
    loop = write_loop(tmp_path, """\
        budget: {tokens: 5000, cost_usd: 0.01}
        start: prep
        states:
          prep:
            shell: touch dry-run-executed
            next: draft
          draft:
            llm: {model: m, prompt: "hi"}
            gates:
              before: [{shell: "true", name: ready}]
              after: [{expr: "draft.text != ''", name: non-empty}]
            retry: {max_attempts: 2}
            next: done
          done: {end: completed}
        """)
    probe = (
        "import sys\n"
        "from loopdsl.cli import main\n"
        f"sys.argv = ['loopdsl', 'run', {str(loop)!r}, '--dry-run']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('EXIT', code)\n"
        "print('LITELLM', 'litellm' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LOOPDSL_STORE": str(tmp_path / "store")})
    out = proc.stdout
    assert "EXIT 0" in out, proc.stderr
    assert "LITELLM False" in out
    for word in ("prep", "draft", "done", "ready", "non-empty"):
        assert word in out
    assert "5000" in out or "5,000" in out  # the budget caps the projection
    assert not (tmp_path / "dry-run-executed").exists()
    assert not (tmp_path / "store").exists()
