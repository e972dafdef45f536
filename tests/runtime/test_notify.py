"""`notify:` webhooks (docs/dsl.md, notify), through `loopdsl` commands (in-process) with
scripted replies, against a webhook receiver on loopback written here: what arrives for a
waiting and a failed run, the Slack format, a secret URL kept out of everything stored or
printed, a dead receiver costing a run at most its timeout, and a resume not sending twice.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from loopdsl.adapters.store.run_store import RunStore

sys.path.insert(0, str(Path(__file__).parents[1]))
from cli_in_process import cli_in_process  # noqa: E402
from on_a_terminal import interruptible_loopdsl  # noqa: E402
from ports import free_port  # noqa: E402

SECRET_PATH = "hook-Zr81qK7wLm2sPuniq"  # the part of the secret URL that must never show


class Receiver:
    """Records every POST (path, headers, decoded JSON body) and answers 200."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.posts.append({"path": self.path, "type": self.headers.get("Content-Type"),
                                    "body": json.loads(body)})
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict[str, Any]]:
        return [p["body"] for p in self.posts]


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    yield rec
    rec.server.shutdown()
    rec.server.server_close()


def write_loop(base: Path, notify: str, *, end: str = "checkpoint", budget: str = "") -> Path:
    """A loop that drafts with a model, then waits at a checkpoint (or fails, or completes)."""
    tail = {
        "checkpoint": """\
  ask:
    checkpoint: {message: "Publish {{ draft.text }}?"}
    transitions:
      - {to: done, when: "ask.decision == 'approve'"}
      - {to: dropped}
  dropped: {end: failed}""",
        "fail": """\
  ask:
    shell: echo "broke on purpose" >&2; exit 3
    next: done""",
        "complete": """\
  ask:
    shell: "true"
    next: done""",
    }[end]
    loop = base / "loop.yaml"
    loop.write_text(f"""\
loopdsl: 1
name: notify-test
secrets: [HOOK_URL]
{budget}
models:
  m: {{model: openai/gpt-4o-mini, max_tokens: 100}}
{notify}
start: draft
states:
  draft:
    llm: {{model: m, prompt: "Write a note"}}
    next: ask
{tail}
  done: {{end: completed}}
""", encoding="utf-8")
    (base / "replies.yaml").write_text('draft:\n  - text: "the <!channel> release & notes"\n', encoding="utf-8")
    return loop


def cli(base: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """`loopdsl ARGS` in this process (tests/cli_in_process.py): the answer is the point here;
    the Ctrl-C and import-probe tests below start real processes."""
    done = cli_in_process(args, base, env)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.encode(), done.stderr.encode())


def run_loop(base: Path, *extra: str, **env: str) -> tuple[subprocess.CompletedProcess[bytes], str]:
    done = cli(base, "run", str(base / "loop.yaml"), "--script", str(base / "replies.yaml"),
               "--store", str(base / "store"), *extra, **env)
    runs = RunStore(base / "store").list_runs()
    return done, runs[0]["run_id"] if runs else ""


def events(base: Path, run_id: str) -> list[dict[str, Any]]:
    return RunStore(base / "store").events(run_id)


def test_a_waiting_run_posts_how_to_decide(tmp_path: Path, receiver: Receiver) -> None:
    write_loop(tmp_path, f"notify:\n  - {{on: [waiting, failed], webhook: {receiver.url}/loopdsl}}")
    done, run_id = run_loop(tmp_path)
    assert done.returncode == 4, done.stderr.decode()[-2000:]
    assert len(receiver.posts) == 1
    post = receiver.posts[0]
    assert post["path"] == "/loopdsl" and post["type"] == "application/json"
    body = post["body"]
    store = str(tmp_path / "store")
    assert body["run_id"] == run_id and body["loop"] == "notify-test" and body["status"] == "waiting"
    assert body["state"] == "ask" and body["message"] == "Publish the <!channel> release & notes?"
    assert body["choices"] == ["approve", "reject"]
    assert body["decide"] == [f"loopdsl approve {run_id} --store {store}", f"loopdsl reject {run_id} --store {store}",
                              f"loopdsl resume {run_id} --store {store}"]
    assert body["spent"]["steps"] >= 1 and body["spent"]["tokens"] > 0
    sent = [e for e in events(tmp_path, run_id) if e["type"] == "notified"]
    assert [(e["status"], e["to"]) for e in sent] == [("waiting", receiver.url)]
    shown = cli(tmp_path, "show", run_id, "--store", store)
    assert f"notified {receiver.url} (waiting)" in shown.stdout.decode()
    # The command the notification gives works as given.
    approve = cli(tmp_path, *body["decide"][0].split()[1:])
    assert approve.returncode == 0, approve.stderr.decode()


def test_a_failed_run_posts_its_error(tmp_path: Path, receiver: Receiver) -> None:
    write_loop(tmp_path, f"notify:\n  - {{on: [waiting, failed], webhook: {receiver.url}/x}}", end="fail")
    done, run_id = run_loop(tmp_path)
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    [body] = receiver.bodies()
    assert body["status"] == "failed" and body["run_id"] == run_id and body["state"] == "ask"
    assert body["error"]["kind"] and "decide" not in body
    assert "exit" in body["message"] or "3" in body["message"]


def test_a_run_out_of_budget_posts_which_cap(tmp_path: Path, receiver: Receiver) -> None:
    write_loop(tmp_path, f"notify:\n  - {{on: [budget_exhausted], webhook: {receiver.url}/b}}", end="complete",
               budget="budget: {steps: 1}")
    done, run_id = run_loop(tmp_path)
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    [body] = receiver.bodies()
    assert body["status"] == "budget_exhausted" and body["run_id"] == run_id
    assert body["error"]["kind"] == "budget" and "steps" in body["message"]


def test_a_failed_send_is_tried_again_by_a_resume_that_commits_the_same_status(tmp_path: Path,
                                                                               receiver: Receiver) -> None:
    write_loop(tmp_path, "notify:\n  - {on: [waiting], secret: HOOK_URL}")
    done, run_id = run_loop(tmp_path)  # HOOK_URL not set: recorded, not sent
    assert done.returncode == 4 and b"notify secret HOOK_URL FAILED (waiting): secret HOOK_URL is not set" in done.stderr
    again = cli(tmp_path, "resume", run_id, "--store", str(tmp_path / "store"), HOOK_URL=f"{receiver.url}/late")
    assert again.returncode == 4, again.stderr.decode()
    assert [(p["path"], p["body"]["status"]) for p in receiver.posts] == [("/late", "waiting")]
    kinds = [e["type"] for e in events(tmp_path, run_id) if e["type"].startswith("notif")]
    assert kinds == ["notify_failed", "notified"]


def test_slack_format_escapes_what_slack_would_read_as_markup(tmp_path: Path, receiver: Receiver) -> None:
    write_loop(tmp_path, f"notify:\n  - {{on: [waiting], webhook: {receiver.url}/s, format: slack}}")
    done, run_id = run_loop(tmp_path)
    assert done.returncode == 4, done.stderr.decode()[-2000:]
    [body] = receiver.bodies()
    assert set(body) == {"text"}
    text = body["text"]
    assert f"run `{run_id}` of loop *notify-test* is *waiting* at `ask`" in text
    assert "> Publish the &lt;!channel&gt; release &amp; notes?" in text
    assert "<!channel>" not in text  # a model's words never ping a channel
    assert f"`loopdsl approve {run_id} --store {tmp_path / 'store'}`" in text


def test_a_secret_url_never_reaches_the_store_or_the_output(tmp_path: Path, receiver: Receiver) -> None:
    write_loop(tmp_path, "notify:\n  - {on: [waiting], secret: HOOK_URL}\n"
                         "  - {on: [waiting], secret: HOOK_URL, format: slack}")
    url = f"{receiver.url}/{SECRET_PATH}"
    # The model echoes the URL: the waiting message quotes it, and the events must not.
    (tmp_path / "replies.yaml").write_text(f'draft:\n  - text: "see {url} now"\n', encoding="utf-8")
    done, run_id = run_loop(tmp_path, HOOK_URL=url)
    assert done.returncode == 4, done.stderr.decode()[-2000:]
    assert [p["path"] for p in receiver.posts] == [f"/{SECRET_PATH}"] * 2
    # Each webhook is posted from its own thread: the two can arrive in either order.
    [json_body] = [body for body in receiver.bodies() if "message" in body]
    [slack_body] = [body for body in receiver.bodies() if set(body) == {"text"}]
    assert json_body["message"] == "Publish see *** now?" and "see *** now" in slack_body["text"]
    shown = cli(tmp_path, "show", run_id, "--store", str(tmp_path / "store"), "--json", HOOK_URL=url)
    assert b"secret HOOK_URL" in shown.stdout
    # and when the send fails, its reason does not quote the URL either
    dead = f"http://127.0.0.1:{free_port()}/{SECRET_PATH}"
    (tmp_path / "replies.yaml").write_text(f'draft:\n  - text: "see {dead} now"\n', encoding="utf-8")
    (tmp_path / "store2").mkdir()
    failed = cli(tmp_path, "run", str(tmp_path / "loop.yaml"), "--script", str(tmp_path / "replies.yaml"),
                 "--store", str(tmp_path / "store2"), HOOK_URL=dead)
    assert failed.returncode == 4 and b"notify secret HOOK_URL FAILED (waiting): " in failed.stderr
    leaks = [str(p) for p in [*tmp_path.rglob("*")]
             if p.is_file() and p.name != "replies.yaml" and SECRET_PATH.encode() in p.read_bytes()]
    assert not leaks
    for proc in (done, shown, failed):
        assert SECRET_PATH.encode() not in proc.stdout + proc.stderr


def test_resume_does_not_send_again_and_each_new_status_is_sent_once(tmp_path: Path, receiver: Receiver) -> None:
    write_loop(tmp_path, f"notify:\n  - {{on: [waiting, completed, aborted], webhook: {receiver.url}/r}}")
    done, run_id = run_loop(tmp_path)
    assert done.returncode == 4
    store = str(tmp_path / "store")
    again = cli(tmp_path, "resume", run_id, "--store", store)  # no decision yet: still waiting
    assert again.returncode == 4, again.stderr.decode()
    assert [b["status"] for b in receiver.bodies()] == ["waiting"]
    assert cli(tmp_path, "approve", run_id, "--store", store).returncode == 0
    finished = cli(tmp_path, "resume", run_id, "--store", store)
    assert finished.returncode == 0, finished.stderr.decode()
    assert [b["status"] for b in receiver.bodies()] == ["waiting", "completed"]
    waited, ended = RunStore(tmp_path / "store").load(run_id)["meta"]["notified"]
    assert waited.startswith("0:waiting:ask:") and ended == "0:completed"
    # A run aborted from outside notifies too.
    assert run_loop(tmp_path)[0].returncode == 4
    other = next(r["run_id"] for r in RunStore(tmp_path / "store").list_runs() if r["run_id"] != run_id)
    assert cli(tmp_path, "abort", other, "--store", store).returncode == 0
    assert [b["status"] for b in receiver.bodies()] == ["waiting", "completed", "waiting", "aborted"]


class Silent:
    """A port that accepts connections (the kernel's backlog) and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"


def timed_run(base: Path, notify: str) -> tuple[float, subprocess.CompletedProcess[bytes], str]:
    base.mkdir()
    write_loop(base, notify, end="complete")
    started = time.monotonic()
    done, run_id = run_loop(base)
    return time.monotonic() - started, done, run_id


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
@pytest.mark.parametrize("dead", ["silent", "refused"])
def test_a_dead_webhook_costs_a_run_at_most_its_timeout(tmp_path: Path, dead: str) -> None:
    silent = Silent()
    url = silent.url if dead == "silent" else f"http://127.0.0.1:{free_port()}/hook"
    try:
        plain, base_run, _ = timed_run(tmp_path / "plain", "")
        slow, done, run_id = timed_run(tmp_path / "dead", f"notify:\n  - {{on: [completed], webhook: {url}}}")
    finally:
        silent.sock.close()
    assert base_run.returncode == 0 and done.returncode == 0, done.stderr.decode()[-2000:]
    print(f"{dead}: without notify {plain:.2f}s, with a dead webhook {slow:.2f}s")
    assert slow - plain < 2.0 + 3.0, (slow, plain)  # the default timeout, and a generous margin for load
    [failed] = [e for e in events(tmp_path / "dead", run_id) if e["type"] == "notify_failed"]
    assert failed["status"] == "completed" and failed["message"]
    if dead == "silent":
        assert failed["message"] == "no answer within 2s" or "timed out" in failed["message"]
    assert RunStore(tmp_path / "dead" / "store").load(run_id)["status"] == "completed"
    shown = cli(tmp_path / "dead", "show", run_id, "--store", str(tmp_path / "dead" / "store"))
    assert "notify http://127.0.0.1:" in shown.stdout.decode() and "FAILED (completed)" in shown.stdout.decode()


@pytest.mark.parametrize("command", ["lint", "graph", "validate"])
def test_checking_a_loop_that_notifies_loads_no_http_client(command: str) -> None:
    probe = ("import sys\nfrom loopdsl.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m in ('urllib.request', 'http.client', 'httpx', 'litellm')"
             " or m.startswith('loopdsl.adapters.webhook')), file=sys.stderr)\n")
    loop = Path(__file__).parents[1] / "data" / "ok" / "notify_url.yaml"
    done = subprocess.run([sys.executable, "-c", probe, command, str(loop)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr[-2000:]


def test_loopdsl_test_never_posts(tmp_path: Path, receiver: Receiver) -> None:
    write_loop(tmp_path, f"notify:\n  - {{on: [waiting, failed, completed], webhook: {receiver.url}/t}}")
    (tmp_path / "loop.test.yaml").write_text(
        "loop: loop.yaml\nscript:\n  draft: [a note]\n  ask: [{decision: approve}]\nexpect:\n  status: completed\n",
        encoding="utf-8")
    done = cli(tmp_path, "test", str(tmp_path / "loop.test.yaml"))
    assert done.returncode == 0, (done.stdout + done.stderr).decode()[-2000:]
    assert receiver.posts == []


def test_ctrl_c_notifies_the_aborted_run(tmp_path: Path, receiver: Receiver) -> None:
    import signal

    marks = tmp_path / "started"
    (tmp_path / "loop.yaml").write_text(f"""\
loopdsl: 1
name: notify-sleeper
notify:
  - {{on: [aborted], webhook: {receiver.url}/a}}
start: nap
states:
  nap:
    shell: touch started; sleep 30
    next: done
  done: {{end: completed}}
""", encoding="utf-8")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    proc = subprocess.Popen(interruptible_loopdsl("run", str(tmp_path / "loop.yaml"), "--store", str(tmp_path / "store")),
                            cwd=tmp_path, env=environ, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while not marks.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()[-2000:]
    [body] = receiver.bodies()
    assert body["status"] == "aborted" and body["error"]["kind"] == "interrupted"
