"""A run never commits a declared secret: `loopdsl run` in real git repositories whose
commands write the secret into files of the run's worktree (one case a real subprocess, the
others through click in this process: the same command's exit code and output).

docs/dsl.md, secret rules 6: credential files the run created are never committed; any
other file whose name or content holds a secret (in any form the redactor knows) refuses
the commit, the run ends `failed` naming the file, and the branch keeps nothing of the run.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from cli_in_process import cli_in_process
from git_repos import git_output as _git, owned_repo
from cli_forked import loopdsl_command

SECRET = "npm_Q7tR2vX9kLm4Pz8Wc1Yb"
# What the commands below write, byte for byte: each must be absent from everything kept.
BASIC = base64.b64encode(f"ci-bot:{SECRET}".encode())  # the secret at offset 7 (1 mod 3)
WRAPPED_STREAM = base64.b64encode(("x" * 41 + SECRET + "y" * 80).encode())  # offset 41 (2 mod 3)
WRAPPED = b"\n".join(WRAPPED_STREAM[i:i + 76] for i in range(0, len(WRAPPED_STREAM), 76))
FORMS = [SECRET.encode(), SECRET.encode().hex().encode(), BASIC, WRAPPED_STREAM, json.dumps(SECRET).encode()]

WRITE_FORMS = textwrap.dedent("""\
    import base64, os, sys
    t = os.environ["NPM_TOKEN"]
    open("raw.txt", "w").write("token " + t + "\\n")
    open("hex.txt", "w").write(t.encode().hex() + "\\n")
    open("basic.txt", "w").write("Authorization: Basic " + base64.b64encode(("ci-bot:" + t).encode()).decode() + "\\n")
    s = base64.b64encode(("x" * 41 + t + "y" * 80).encode()).decode()
    open("wrapped.txt", "w").write("\\n".join(s[i:i + 76] for i in range(0, len(s), 76)) + "\\n")
    open("notes.txt", "w").write("nothing secret here\\n")
    """)


def _loop(cmd: str) -> str:
    return textwrap.dedent("""\
        loopdsl: 1
        name: writes-a-secret
        workspace: {worktree: true}
        secrets: [NPM_TOKEN]
        start: work
        states:
          work:
            shell:
              cmd: |
        %s
              env: {NPM_TOKEN: "{{ secrets.NPM_TOKEN }}"}
            next: done
          done: {end: completed}
        """) % textwrap.indent(cmd, " " * 10)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    # .env: a credential file name the project already tracks
    return owned_repo(tmp_path / "repo", {"README.md": "project\n", ".env": "MODE=dev\n", "writer.py": WRITE_FORMS},
                      owner="Repo Owner")


def _run(repo: Path, cmd: str, *, real: bool = False) -> tuple[subprocess.CompletedProcess[bytes], dict, Path]:
    loop = repo.parent / "loop.yaml"  # outside the repository: the run must not commit it
    loop.write_text(_loop(cmd), encoding="utf-8")
    store = repo.parent / "store"
    args = ["run", str(loop), "--json", "--store", str(store)]
    if real:
        env = {**os.environ, "NPM_TOKEN": SECRET}
        env.pop("LOOPDSL_STORE", None)
        proc = subprocess.run([*loopdsl_command(), *args], cwd=repo, env=env, capture_output=True,
                              timeout=180)
    else:
        done = cli_in_process(args, repo, {"NPM_TOKEN": SECRET})
        proc = subprocess.CompletedProcess(args, done.returncode, done.stdout.encode(), done.stderr.encode())
    summary = json.loads(proc.stdout.decode().splitlines()[-1])
    return proc, summary, store


def _branch_blobs(repo: Path, run_id: str) -> bytes:
    """Every file of every commit on the run's branch, concatenated."""
    out = b""
    for commit in _git(repo, "rev-list", f"loopdsl/{run_id}").split():
        for path in _git(repo, "ls-tree", "-r", "--name-only", commit).split("\n"):
            if path:
                out += subprocess.run(["git", "show", f"{commit}:{path}"], cwd=repo, capture_output=True).stdout
    return out


def _holding_secret(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and ".git" not in p.parts and any(f in p.read_bytes() for f in FORMS))


def test_credential_files_the_run_creates_are_never_committed(repo: Path) -> None:
    proc, summary, store = _run(repo, real=True, cmd=textwrap.dedent("""\
        printf '//registry.npmjs.org/:_authToken=%s\\n' "$NPM_TOKEN" > .npmrc
        printf 'machine example.invalid password %s\\n' "$NPM_TOKEN" > .netrc
        mkdir -p keys && printf '%s' "$NPM_TOKEN" > keys/deploy.pem
        echo "MODE=ci" > .env
        echo "work done" > result.txt"""))
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert summary["status"] == "completed"
    run_id = summary["run_id"]
    files = _git(repo, "ls-tree", "-r", "--name-only", f"loopdsl/{run_id}").split()
    assert "result.txt" in files and ".env" in files  # .env was tracked: its change is kept
    assert not {".npmrc", ".netrc", "keys/deploy.pem"} & set(files)
    assert _git(repo, "show", f"loopdsl/{run_id}:.env") == "MODE=ci\n"
    assert SECRET.encode() not in _branch_blobs(repo, run_id)
    assert not (store / "worktrees" / run_id).exists()  # the credential files went with the worktree
    assert _holding_secret(store) == [] and _holding_secret(repo) == []


def test_a_secret_in_any_encoding_refuses_the_commit_and_names_the_files(repo: Path) -> None:
    proc, summary, store = _run(repo, "python3 writer.py")
    assert proc.returncode == 1, proc.stderr.decode()[-2000:]
    assert summary["status"] == "failed"
    events = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    failed = [e for e in events if e.get("type") == "failed"]
    assert failed and failed[-1]["kind"] == "workspace"
    message = failed[-1]["message"]
    for name in ("basic.txt", "hex.txt", "raw.txt", "wrapped.txt"):
        assert name in message
    assert "notes.txt" not in message and "not committing" in message
    run_id = summary["run_id"]
    base = _git(repo, "rev-parse", "main")
    assert _git(repo, "rev-parse", f"loopdsl/{run_id}") == base  # nothing of the run on its branch
    worktree = store / "worktrees" / run_id
    assert (worktree / "notes.txt").exists()  # kept for inspection, changes staged
    # The secret is only in the files the command wrote, nowhere loopdsl printed or stored.
    for stream in (proc.stdout, proc.stderr):
        assert not any(f in stream for f in FORMS)
    assert WRAPPED in (worktree / "wrapped.txt").read_bytes()
    assert [p for p in _holding_secret(store) if not p.startswith(f"worktrees/{run_id}/")] == []
    shown = subprocess.run([*loopdsl_command(), "show", run_id, "--store", str(store)],
                           cwd=repo, capture_output=True, timeout=60)
    assert b"raw.txt" in shown.stdout and not any(f in shown.stdout + shown.stderr for f in FORMS)


def test_a_secret_a_command_committed_itself_is_caught_and_unlinked_from_the_branch(repo: Path) -> None:
    proc, summary, _store = _run(repo, textwrap.dedent("""\
        printf 'token=%s\\n' "$NPM_TOKEN" > config.ini
        git add config.ini && git -c user.name=x -c user.email=x@x commit -q -m "add config"
        echo "later" > later.txt"""))
    assert proc.returncode == 1 and summary["status"] == "failed"
    assert b"config.ini" in proc.stdout and SECRET.encode() not in proc.stdout + proc.stderr
    base = _git(repo, "rev-parse", "main")
    assert _git(repo, "rev-parse", f"loopdsl/{summary['run_id']}") == base  # a push would send nothing


def test_a_secret_in_a_file_name_is_caught(repo: Path) -> None:
    proc, summary, _store = _run(repo, 'touch "cache-$NPM_TOKEN.json"')
    assert proc.returncode == 1 and summary["status"] == "failed"
    assert b"cache-***.json" in proc.stdout and SECRET.encode() not in proc.stdout + proc.stderr


def test_a_secret_in_a_commit_message_is_caught(repo: Path) -> None:
    proc, summary, _store = _run(repo, textwrap.dedent("""\
        echo change > change.txt
        git add change.txt && git -c user.name=x -c user.email=x@x commit -q -m "deploy with $NPM_TOKEN\""""))
    assert proc.returncode == 1 and summary["status"] == "failed"
    assert b"the message of a commit a command made" in proc.stdout and SECRET.encode() not in proc.stdout


def test_a_file_name_that_is_not_utf8_is_named_without_a_crash(repo: Path) -> None:
    proc, summary, _store = _run(repo, "printf '%s' \"$NPM_TOKEN\" > \"$(printf 'bad-\\377-name.txt')\"")
    assert proc.returncode == 1 and summary["status"] == "failed", proc.stderr.decode()[-2000:]
    assert b"bad-\\\\xff-name.txt" in proc.stdout and b"Traceback" not in proc.stderr
