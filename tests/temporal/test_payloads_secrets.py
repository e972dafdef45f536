"""TEMPORAL.md sections 2 and 8 on a real dev server: what an activity returns fits a
payload (command output cut to the field limit, a model reply too big to keep fails the
call with both sizes), and a declared secret's value reaches the command that asks for
it but never the workflow's history."""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from loopdsl.adapters.temporal.payloads import FIELD_LIMIT, RESULT_LIMIT
from tests.stub_server import StubServer

from .conftest import Workers, loopdsl
from .replay import replay

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-Value-4c9d1e7f0a"

BIG = """\
loopdsl: 1
name: big
secrets: [DEPLOY_TOKEN]
inputs: {x: {type: string, default: ""}}
start: shout
states:
  shout:
    shell: "python3 -c \\"import sys; sys.stdout.write('a' * 700000); sys.stderr.write('b' * 700000)\\""
    idempotent: true
    next: token
  token:
    shell:
      cmd: "echo token=$DEPLOY_TOKEN; echo \\"$DEPLOY_TOKEN\\" | wc -c"
      env: {DEPLOY_TOKEN: "{{ secrets.DEPLOY_TOKEN }}"}
    idempotent: true
    next: probe
  probe:
    shell:
      argv: [python3, -c, "import os, sys; print(sys.argv[1], os.environ['V'])", "{{ inputs.x }}"]
      env: {V: "{{ inputs.x }}"}
    idempotent: true
    next: done
  done:
    end: completed
    output: {out_len: "{{ shout.stdout | length }}", cut: "{{ 'bytes cut' in shout.stdout }}", token: "{{ token.stdout }}",
             probe: "{{ probe.stdout }}"}
"""


def _run(repo: Path, workers: Workers, *args: str, **env: str) -> dict[str, Any]:
    out = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, "--json",
                  "--quiet", *args, cwd=repo, **env)
    assert out.returncode in (0, 1, 4), out.stderr  # 4: waiting for a person
    return dict(json.loads(out.stdout.splitlines()[-1]))


async def _history_bytes(address: str, run_id: str) -> list[bytes]:
    from temporalio.client import Client

    client = await Client.connect(address)
    history = await client.get_workflow_handle(run_id).fetch_history()
    return [event.SerializeToString() for event in history.events]


def test_output_is_cut_to_fit_and_a_secret_never_enters_the_history(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "loop.yaml").write_text(BIG)
    # The worker's environment holds the value, and another variable the loop does not declare.
    workers.start(repo, models=False, DEPLOY_TOKEN=SECRET, WORKER_ONLY="w0rker-only-Value-77")
    # An input that looks like a placeholder stays text: it once put any of the worker's
    # variables into a command's argv and env.
    hostile = "@@loopdsl-secret:WORKER_ONLY@@ @@loopdsl-secret:x:DEPLOY_TOKEN@@ @@loopdsl-secret:x:WORKER_ONLY@@"
    summary = _run(repo, workers, "--input", f"x={hostile}")
    assert summary["status"] == "completed", summary
    outputs = summary["outputs"]
    assert FIELD_LIMIT // 2 < int(outputs["out_len"]) <= FIELD_LIMIT + 100  # cut to the limit, head and tail kept
    assert outputs["cut"] is True  # the cut is marked in the text
    # The command got the value (its length: 23 characters and a newline), and what it printed is redacted.
    assert outputs["token"] == "token=***\n24\n", outputs["token"]
    assert outputs["probe"] == f"{hostile} {hostile}\n", outputs["probe"]

    events = asyncio.run(_history_bytes(workers.address, summary["run_id"]))
    assert max(len(e) for e in events) < FIELD_LIMIT * 2 + 64 * 1024, "an event larger than its two cut fields"
    everything = b"".join(events)
    assert SECRET.encode() not in everything
    assert re.search(rb"@@loopdsl-secret:[0-9a-f-]{36}:DEPLOY_TOKEN@@", everything)  # the name travels, not the value
    assert b"w0rker-only" not in everything
    replay(workers.address, summary["run_id"], repo)


TOO_BIG_REPLY = """\
loopdsl: 1
name: huge
models:
  m: {{model: openai/gpt-4o-mini, api_base: "{api_base}", max_tokens: 50}}
start: ask
states:
  ask:
    llm: {{model: m, prompt: "say a lot"}}
    next: done
  done: {{end: completed}}
"""


def test_a_model_reply_too_big_for_the_history_fails_the_call_and_is_charged(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_text("x" * (RESULT_LIMIT + 1000), prompt_tokens=10, completion_tokens=5)
        (repo / "loop.yaml").write_text(TOO_BIG_REPLY.format(api_base=stub.api_base))
        workers.start(repo)
        summary = _run(repo, workers)
        assert len(stub.requests) == 1
    assert summary["status"] == "failed", summary
    assert summary["spent"]["tokens"] > 0  # paid, so charged (its whole reservation)
    shown = loopdsl("show", summary["run_id"], "--temporal", workers.address, "--json", cwd=repo)
    error = json.loads(shown.stdout)["run"]["error"]
    assert "Temporal workflow's history" in error["message"] and f"{RESULT_LIMIT:,}" in error["message"], error



PROMPT_SECRET = """\
loopdsl: 1
name: leaky
secrets: [DEPLOY_TOKEN]
models:
  m: {{model: openai/gpt-4o-mini, api_base: "{api_base}", max_tokens: 50}}
start: ask
states:
  ask:
    llm: {{model: m, prompt: "the token is {{{{ secrets.DEPLOY_TOKEN }}}}"}}
    next: done
  done: {{end: completed}}
"""


def test_a_prompt_using_a_secret_is_refused_on_this_backend(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_text("never")
        (repo / "loop.yaml").write_text(PROMPT_SECRET.format(api_base=stub.api_base))
        workers.start(repo, models=False, DEPLOY_TOKEN=SECRET)  # refused before any model would be called
        summary = _run(repo, workers)
        assert stub.requests == [], "the secret was sent to the model"
    assert summary["status"] == "failed" and summary["path"] == ["ask"], summary
    shown = loopdsl("show", summary["run_id"], "--temporal", workers.address, "--json", cwd=repo)
    assert "may not carry a secret" in json.loads(shown.stdout)["run"]["error"]["message"]
    assert SECRET.encode() not in b"".join(asyncio.run(_history_bytes(workers.address, summary["run_id"])))


def test_a_no_models_worker_refuses_a_real_model_call(tmp_path: Path, workers: Workers) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_text("never")
        (repo / "loop.yaml").write_text(PROMPT_SECRET.format(api_base=stub.api_base).replace(
            "the token is {{ secrets.DEPLOY_TOKEN }}", "hello"))
        workers.start(repo, models=False, OPENAI_API_KEY="sk-stub")
        summary = _run(repo, workers)
        assert stub.requests == [], "a --no-models worker called the model"
    assert summary["status"] == "failed" and summary["path"] == ["ask"], summary
    shown = loopdsl("show", summary["run_id"], "--temporal", workers.address, "--json", cwd=repo)
    message = json.loads(shown.stdout)["run"]["error"]["message"]
    assert "state 'ask' calls a model" in message and "--no-models" in message, message


CREDENTIAL_ECHO = """\
loopdsl: 1
name: echo-credential
models:
  m: {{model: openai/gpt-4o-mini, api_base: "{api_base}", max_tokens: 50}}
start: ask
states:
  ask:
    llm: {{model: m, prompt: "what do you know?"}}
    next: check
  check:
    checkpoint: {{message: "go on?"}}
    next: done
  done: {{end: completed, output: {{said: "{{{{ ask.text }}}}"}}}}
"""


def test_a_workers_credential_in_a_reply_or_a_comment_never_reaches_the_history(tmp_path: Path,
                                                                                 workers: Workers) -> None:
    """A model reply quoting a credential of the worker's environment went into the history as
    it was (the local backend redacts it), and so did a credential pasted in a decision's comment."""
    worker_key, ci_token = "sk-worker-Key-0123456789abcdef", "ghp_CiToken0123456789abcdefABCDEF"
    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_text(f"the key is {worker_key} ok", prompt_tokens=10, completion_tokens=5)
        (repo / "loop.yaml").write_text(CREDENTIAL_ECHO.format(api_base=stub.api_base))
        workers.start(repo, OPENAI_API_KEY=worker_key)
        waiting = _run(repo, workers)
        assert waiting["status"] == "waiting", waiting
        approved = loopdsl("approve", waiting["run_id"], "--temporal", workers.address, "--comment",
                           f"token {ci_token} is fine", cwd=repo, GH_TOKEN=ci_token)
        assert approved.returncode == 0, approved.stderr
        shown = loopdsl("show", waiting["run_id"], "--temporal", workers.address, "--json", cwd=repo)
    assert "the key is *** ok" in shown.stdout and "token *** is fine" in shown.stdout, shown.stdout[-2000:]
    everything = b"".join(asyncio.run(_history_bytes(workers.address, waiting["run_id"])))
    assert worker_key.encode() not in everything and ci_token.encode() not in everything


RELAYED = """\
loopdsl: 1
name: relayed
secrets: [MYVALUE]
models:
  m: {{model: openai/gpt-4o-mini, api_base: "{api_base}", max_tokens: 50}}
start: keep
states:
  keep:
    shell:
      cmd: 'printf "%s" "$MYVALUE" > v.txt'
      env: {{MYVALUE: "{{{{ secrets.MYVALUE }}}}"}}
    next: show
  show:
    shell: cat v.txt
    next: ask
  ask:
    llm: {{model: m, prompt: "what is in v.txt?"}}
    next: done
  done: {{end: completed, output: {{said: "{{{{ show.stdout }}}}", told: "{{{{ ask.text }}}}"}}}}
"""


def test_a_declared_secret_a_command_was_not_given_is_redacted_too(tmp_path: Path, workers: Workers) -> None:
    """A neutral name (no TOKEN/KEY/SECRET in it): only the declaration makes it a secret. The
    second command was not given it, but prints it from a file; the model quotes it back."""
    value = "hunter2hunter2xyz"
    repo = tmp_path / "repo"
    repo.mkdir()
    with StubServer() as stub:
        stub.reply_text(f"the file says {value}")
        (repo / "loop.yaml").write_text(RELAYED.format(api_base=stub.api_base))
        workers.start(repo, MYVALUE=value, OPENAI_API_KEY="sk-stub-key-1234")
        summary = _run(repo, workers)
    assert summary["status"] == "completed", summary
    assert (repo / "v.txt").read_text() == value  # the command had it
    assert summary["outputs"] == {"said": "***", "told": "the file says ***"}, summary["outputs"]
    everything = b"".join(asyncio.run(_history_bytes(workers.address, summary["run_id"])))
    assert value.encode() not in everything
