"""Declared secrets never leave the process unredacted: a real CLI run in a subprocess whose
commands, gate, prompt, model reply and failure all carry the secret, then a byte-wise
search of everything the run showed or stored.

What the docs promise (docs/dsl.md, secret rules): values are read from the environment,
never stored, and redacted from every output, trace and error message; a command gets
one as an environment variable when its `env:` passes it. So a command may still write
"$MY_TOKEN" into a file of its own (the loop author asked for that, and loopdsl cannot see
it); but every value loopdsl renders from captured output or model replies is already redacted.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from cli_in_process import cli_in_process  # noqa: E402
from cli_forked import loopdsl_command

pytestmark = pytest.mark.xdist_group("leaky-run")  # the run every test inspects, once (tests/conftest.py)
SECRET = "zq9-SECRET-7Vx3kLw8uniq"
VARIANTS = [SECRET.encode(), base64.b64encode(SECRET.encode()), base64.b64encode(SECRET.encode()).rstrip(b"=")]

LOOP = """\
loopdsl: 1
name: secret-leaks
secrets: [MY_TOKEN]
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 100}
outputs:
  reply: "{{ ask.text }}"
  shell_said: "{{ leak.stdout }}"
start: leak
states:
  leak:
    shell:
      cmd: echo "stdout $MY_TOKEN"; echo "stderr $MY_TOKEN" >&2; printf '%s' "$MY_TOKEN" > direct.txt
      env: {MY_TOKEN: "{{ secrets.MY_TOKEN }}"}
    next: ask
  ask:
    llm:
      model: m
      prompt: "Token {{ secrets.MY_TOKEN }}. Shell said {{ leak.stdout }} / {{ leak.stderr }}. {{ feedback }}"
    gates:
      after:
        - name: leaky-gate
          shell:
            cmd: echo "gate saw $MY_TOKEN and {{ ask.text }}"; test "{{ run.attempt }}" -ge 2
            env: {MY_TOKEN: "{{ secrets.MY_TOKEN }}"}
    retry: {max_attempts: 2, backoff: {initial: 0s}}
    next: save
  save:
    shell: printf '%s|%s|%s\\n' "{{ ask.text }}" "{{ leak.stdout }}" "{{ history.ask[0].error.message }}" > rendered.txt
    next: boom
  boom:
    shell:
      cmd: echo "dying with $MY_TOKEN" >&2; exit 3
      env: {MY_TOKEN: "{{ secrets.MY_TOKEN }}"}
    next: done
  done: {end: completed}
"""


def files_containing_secret(root: Path) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if any(v in data for v in VARIANTS):
                hits.append(str(path.relative_to(root)))
    return hits


@pytest.fixture(scope="module")
def leaky_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("secrets")
    loop = base / "loop.yaml"
    loop.write_text(LOOP, encoding="utf-8")
    script = base / "replies.yaml"  # outside the workdir and store: the test wrote it, not the run
    script.write_text(textwrap.dedent(f"""\
        ask:
          - text: "first: I saw {SECRET}"
          - text: "second: still {SECRET}"
        """), encoding="utf-8")
    work = base / "work"
    work.mkdir()
    store = base / "store"
    env = {**os.environ, "MY_TOKEN": SECRET}
    env.pop("LOOPDSL_STORE", None)
    proc = subprocess.run(
        [*loopdsl_command(), "run", str(loop), "--script", str(script), "--json", "--store", str(store)],
        cwd=work, env=env, capture_output=True, timeout=180,
    )
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]
    summary = lines[-1]
    show = subprocess.run([*loopdsl_command(), "show", summary["run_id"], "--json", "--store", str(store)],
                          cwd=work, env=env, capture_output=True, timeout=60)
    return {"proc": proc, "lines": lines, "summary": summary, "work": work, "store": store, "show": show}


def test_run_ran_every_leaky_step(leaky_run: dict) -> None:
    proc = leaky_run["proc"]
    assert proc.returncode == 1, proc.stderr.decode()[-2000:]
    summary = leaky_run["summary"]
    assert summary["type"] == "summary" and summary["status"] == "failed"
    assert summary["path"] == ["leak", "ask", "save", "boom"]
    types = [e.get("type") for e in leaky_run["lines"]]
    assert "retry" in types  # the leaky gate failed once
    # the prompt's `secrets.` use is a warning, not an error: the run went ahead
    assert b"Traceback" not in proc.stderr


def test_secret_not_in_cli_stdout_or_stderr(leaky_run: dict) -> None:
    proc = leaky_run["proc"]
    for stream in (proc.stdout, proc.stderr, leaky_run["show"].stdout, leaky_run["show"].stderr):
        assert not any(v in stream for v in VARIANTS)
    # ...and it was redacted, not just absent: the redaction marker stands where it was
    assert b"***" in proc.stdout and b"***" in leaky_run["show"].stdout


def test_secret_not_in_the_stored_run_record_or_events(leaky_run: dict) -> None:
    from loopdsl.adapters.store.run_store import RunStore

    store = RunStore(leaky_run["store"])
    run_id = store.resolve(leaky_run["summary"]["run_id"])
    record = json.dumps(store.load(run_id)).encode()
    events = json.dumps(store.events(run_id)).encode()
    assert b"***" in record and b"***" in events
    assert not any(v in record or v in events for v in VARIANTS)


def test_secret_not_in_any_store_file(leaky_run: dict) -> None:
    store: Path = leaky_run["store"]
    assert [p for p in store.rglob("*") if p.is_file()]  # sqlite database (and WAL, while open)
    assert files_containing_secret(store) == []


def test_values_rendered_by_loopdsl_are_redacted_in_files_the_run_wrote(leaky_run: dict) -> None:
    work: Path = leaky_run["work"]
    # the command itself wrote "$MY_TOKEN": loopdsl hands commands the real value by design
    assert (work / "direct.txt").read_text() == SECRET
    assert files_containing_secret(work) == ["direct.txt"]
    rendered = (work / "rendered.txt").read_text()
    assert rendered.startswith("second: still ***|stdout ***\n|")
    assert "gate saw ***" in rendered


def test_error_message_and_events_redacted(leaky_run: dict) -> None:
    lines = leaky_run["lines"]
    failed = [e for e in lines if e.get("type") == "failed"]
    assert failed and "dying with ***" in failed[-1]["message"]
    gates = [e for e in lines if e.get("type") == "gate" and not e["passed"]]
    assert gates and "gate saw ***" in gates[0]["message"]
    assert leaky_run["summary"]["outputs"]["reply"] == "second: still ***"
    assert leaky_run["summary"]["outputs"]["shell_said"] == "stdout ***\n"


@pytest.mark.parametrize("value", ["x", "te", "abc"])
def test_a_secret_too_short_to_hide_is_refused_before_the_run(tmp_path: Path, value: str) -> None:
    """Redacting a one-letter value would rewrite the run's own field names ("text" became
    "te***t") and crash it; the run is refused with a usage error instead, nothing started."""
    loop = tmp_path / "loop.yaml"
    loop.write_text(LOOP, encoding="utf-8")
    script = tmp_path / "replies.yaml"
    script.write_text("ask:\n  - text: hello\n", encoding="utf-8")
    # In-process (tests/cli_in_process.py): the refusal is the point; leaky_run is a real process.
    proc = cli_in_process(["run", str(loop), "--script", str(script), "--store", str(tmp_path / "store")], tmp_path,
                          {"MY_TOKEN": value})
    err = proc.stderr
    assert proc.returncode == 2, err
    assert "secret MY_TOKEN has fewer than 4 characters" in err and "Traceback" not in err
    assert not (tmp_path / "direct.txt").exists()  # the first state never ran


def test_credentials_of_loopdsls_own_environment_never_reach_a_command(tmp_path: Path) -> None:
    """Undeclared variables that hold credentials stay out of every command's environment,
    and so out of the output the store keeps: by name (GITHUB_PAT, SESSION_COOKIE and SMTP_PASS
    once reached `env`'s output and the store), or by a value that is a URL with a password."""
    loop = tmp_path / "loop.yaml"
    loop.write_text("loopdsl: 1\nname: envdump\nstart: dump\nstates:\n"
                    "  dump: {shell: env, next: done}\n  done: {end: completed}\n")
    hidden = {"GITHUB_PAT": "pat-value-1", "SESSION_COOKIE": "cookie-value-2", "SMTP_PASS": "pass-value-3",
              "DB_PW": "pw-value-4", "GPG_PASSPHRASE": "phrase-value-5",
              "DATABASE_URL": "postgres://app:url-password-6@db.internal/app",
              "OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:url-password-7@collector.example"}
    passed = {"PLAIN_SETTING": "plain-value-8", "PATH_EXTRA": "path-value-9", "HOMEPAGE": "https://example.com/a@b",
              "COMPASS_MODE": "north-value-10"}
    store = tmp_path / "store"
    done = cli_in_process(["run", str(loop), "--store", str(store), "--json"], tmp_path, {**hidden, **passed})
    assert done.returncode == 0, done.stderr
    seen = done.stdout  # the events, with the command's output
    for name, value in hidden.items():
        assert value not in seen, name
    for name, value in passed.items():
        assert f"{name}={value}" in seen, name
    stored = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    assert b"PLAIN_SETTING=plain-value-8" in stored  # the store keeps the output: the check below can fail
    assert not [name for name, value in hidden.items() if value.encode() in stored]


def test_undeclared_credentials_of_loopdsls_environment_are_redacted_from_the_run(tmp_path: Path) -> None:
    """A command of the same user can read loopdsl's own environment (/proc/PID/environ), and a
    model or an input may carry a value from it: an undeclared credential's value was stored in
    clear beside a declared secret's `***`. Values that are no secret (a path, a short word)
    are left alone, or every text that names them would be garbled."""
    loop = tmp_path / "loop.yaml"
    loop.write_text("loopdsl: 1\nname: echo\nstart: say\nstates:\n"
                    "  say: {shell: cat found.txt, next: done}\n  done: {end: completed}\n")
    # What a command read of loopdsl's environment (a file here: /proc/PID/environ shows a
    # process's environment at its start, and this test's loopdsl runs in the test's process).
    (tmp_path / "found.txt").write_text("UNDECLAREDCRED555 /tmp/agent.sock none\n")
    store = tmp_path / "store"
    env = {"OTHER_API_TOKEN": "UNDECLAREDCRED555", "SSH_AUTH_SOCK": "/tmp/agent.sock", "AUTH_MODE": "none"}
    done = cli_in_process(["run", str(loop), "--store", str(store), "--json"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "UNDECLAREDCRED555" not in done.stdout + done.stderr and "*** /tmp/agent.sock none" in done.stdout
    stored = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    assert b"UNDECLAREDCRED555" not in stored and b"/tmp/agent.sock none" in stored


SEALED = """\
loopdsl: 1
name: sealed
secrets: [MY_VALUE]
inputs: {note: {type: string}}
start: ask
states:
  ask: {checkpoint: {message: "go?"}, next: write}
  write:
    shell: printf %s "{{ inputs.note }}" > note.txt
    next: done
  done: {end: completed, output: {n: "{{ inputs.note }}"}}
"""


def test_a_secret_given_as_an_input_is_sealed_in_the_store_and_back_on_resume(tmp_path: Path) -> None:
    """A neutral name: only its declaration makes it a secret. The record kept the input in
    clear (and `show --json` printed it); now a placeholder with the run's seal stands in its
    place, and the resumed run renders the value again from the environment."""
    value = "S3cr3tValue123"
    (tmp_path / "loop.yaml").write_text(SEALED)
    store = tmp_path / "store"
    env = {"MY_VALUE": value}
    first = cli_in_process(["run", "loop.yaml", "--store", str(store), "-i", f"note=pre {value} post"], tmp_path, env)
    assert first.returncode == 4, first.stderr
    assert value.encode() not in b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    run_id = json.loads(cli_in_process(["runs", "--store", str(store), "--json"], tmp_path).stdout)[0]["run_id"]
    shown = cli_in_process(["show", run_id, "--store", str(store), "--json"], tmp_path, env)
    assert value not in shown.stdout and "@@loopdsl-input-secret:" in shown.stdout
    # A forged placeholder in an input (an issue title, say) cannot know the run's seal: it stays text.
    assert cli_in_process(["approve", run_id, "--store", str(store)], tmp_path).returncode == 0
    resumed = cli_in_process(["resume", run_id, "--store", str(store)], tmp_path, env)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "note.txt").read_text() == f"pre {value} post"  # the command got what the first run had
    assert value.encode() not in b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    assert json.loads(cli_in_process(["show", run_id, "--store", str(store), "--json"], tmp_path).stdout)[
        "run"]["outputs"] == {"n": "pre *** post"}


def test_a_forged_placeholder_in_an_input_stays_text_on_resume(tmp_path: Path) -> None:
    (tmp_path / "loop.yaml").write_text(SEALED)
    store = tmp_path / "store"
    env = {"MY_VALUE": "S3cr3tValue123"}
    forged = "@@loopdsl-input-secret:" + "0" * 32 + ":MY_VALUE@@"
    assert cli_in_process(["run", "loop.yaml", "--store", str(store), "-i", f"note={forged}"], tmp_path,
                          env).returncode == 4
    run_id = json.loads(cli_in_process(["runs", "--store", str(store), "--json"], tmp_path).stdout)[0]["run_id"]
    assert cli_in_process(["approve", run_id, "--store", str(store)], tmp_path).returncode == 0
    assert cli_in_process(["resume", run_id, "--store", str(store)], tmp_path, env).returncode == 0
    assert (tmp_path / "note.txt").read_text() == forged
