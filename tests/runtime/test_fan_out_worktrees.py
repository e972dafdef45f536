"""A `for_each` with `concurrency > 1` over a child whose agent writes: each item works in a
git worktree of its own, on a branch of its own, made from the caller's worktree; a
completed item's work is committed on its branch and its worktree removed, a failed item's
worktree is kept; nothing is merged into the caller's branch. Real git repositories."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from git_repos import git_output as _git, owned_repo

import loopdsl
from loopdsl.adapters.store.run_store import RunStore
from loopdsl.runtime.model_port import LlmRequest, LlmResponse

sys.path.insert(0, str(Path(__file__).parent))
from test_agent import Conversation, tool_messages  # noqa: E402  (the conversation-driven provider port)

CHILD = """\
loopdsl: 1
name: item-writer
workspace: {worktree: true}
unattended: true
inputs:
  name: {type: string}
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 200, price: {input_per_mtok: 1, output_per_mtok: 2}}
start: work
states:
  work:
    agent: {model: m, prompt: "Write {{ inputs.name }}.", tools: [write_file, list_files], max_turns: 4}
    next: done
  done: {end: completed, output: {seen: "{{ work.text }}"}}
"""
PARENT = """\
loopdsl: 1
name: fan
workspace: {worktree: true}
start: prep
states:
  prep:
    shell: echo prepared > prep.txt
    next: each
  each:
    loop: child.yaml
    for_each: "['a', 'b', 'c']"
    concurrency: 3
    tolerate_failures: 1
    with: {name: "{{ item }}"}
    next: done
  done: {end: completed, output: {items: "{{ each['items'] | tojson }}"}}
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("LOOPDSL_STORE", raising=False)
    return owned_repo(tmp_path / "repo", {"README": "hello\n"})


class Overlapping(Conversation):
    """Each turn takes a moment, so the items' conversations overlap; counts how many at once."""

    def __init__(self, answer: Any) -> None:
        super().__init__(answer)
        self.now = self.most = 0

    async def complete(self, request: LlmRequest, *, state: str, attempt: int | None = None) -> LlmResponse:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.05)
            return await super().complete(request, state=state, attempt=attempt)
        finally:
            self.now -= 1


def name_of(request: LlmRequest) -> str:
    return str(request.messages[0]["content"] if request.messages[0]["role"] == "user"
               else request.messages[1]["content"]).split()[-1].rstrip(".")


def writer(turn: int, request: LlmRequest) -> Any:
    """Writes its own file and `common.txt` (which would collide in one worktree), lists
    what it sees, then answers with that listing."""
    name = name_of(request)
    if turn == 1:
        return [("write_file", {"path": f"{name}.txt", "content": f"{name}\n"}),
                ("write_file", {"path": "common.txt", "content": f"written by {name}\n"})]
    if turn == 2:
        return [("list_files", {})]
    return tool_messages(request)[-1]["content"]


def run_fan(repo: Path, provider: Conversation, parent: str = PARENT) -> Any:
    (repo / "child.yaml").write_text(CHILD)
    (repo / "loop.yaml").write_text(parent)
    _git(repo, "add", "child.yaml", "loop.yaml")
    _git(repo, "commit", "-q", "-m", "loops")
    return loopdsl.run(repo / "loop.yaml", workdir=repo, provider=provider)


def test_concurrent_writing_items_each_work_on_their_own_branch(repo: Path) -> None:
    provider = Overlapping(writer)
    result = run_fan(repo, provider)
    assert result.status == "completed", result.state.error
    assert provider.most >= 2  # the items' conversations did overlap
    items = result.state.results["each"]["items"]
    run_branch = f"loopdsl/{result.run_id}"
    for index, name in enumerate("abc"):
        item = items[index]
        assert item["status"] == "completed"
        assert item["branch"] == f"{run_branch}--each--{index}"
        assert item["commit"] == _git(repo, "rev-parse", item["branch"]).strip()
        assert "worktree" not in item  # completed: committed, then removed
        assert _git(repo, "show", f"{item['branch']}:{name}.txt") == f"{name}\n"
        assert _git(repo, "show", f"{item['branch']}:common.txt") == f"written by {name}\n"  # no collision
        assert _git(repo, "show", f"{item['branch']}:prep.txt") == "prepared\n"  # made from the caller's files
        seen = item["outputs"]["seen"].split("\n")
        assert f"{name}.txt" in seen and not {f"{n}.txt" for n in "abc" if n != name} & set(seen)
    files = _git(repo, "ls-tree", "-r", "--name-only", run_branch).split()
    assert "prep.txt" in files and not {"a.txt", "b.txt", "c.txt", "common.txt"} & set(files)  # nothing merged
    listed = _git(repo, "worktree", "list", "--porcelain")
    assert listed.count("worktree ") == 1  # only the person's checkout: every run and item worktree is gone
    assert not any(repo.glob("*.txt"))  # the person's checkout untouched


def test_a_failed_item_keeps_its_worktree_and_the_others_are_committed(repo: Path) -> None:
    def failing_c(turn: int, request: LlmRequest) -> Any:
        if name_of(request) == "c" and turn == 2:
            return [("write_file", {"path": "c2.txt", "content": "more\n"})]
        if name_of(request) == "c" and turn >= 3:
            return [("list_files", {})]  # never answers: max_turns
        return writer(turn, request)

    result = run_fan(repo, Overlapping(failing_c))
    assert result.status == "completed", result.state.error  # tolerate_failures: 1
    items = result.state.results["each"]["items"]
    assert [i["status"] for i in items] == ["completed", "completed", "failed"]
    kept = Path(items[2]["worktree"])
    assert (kept / "c.txt").read_text() == "c\n" and (kept / "c2.txt").read_text() == "more\n"
    assert "commit" not in items[2] and items[2]["branch"].endswith("--each--2")
    assert _git(repo, "show", f"{items[0]['branch']}:a.txt") == "a\n"


def test_the_git_guard_of_one_item_lets_its_siblings_commit(repo: Path) -> None:
    """An item whose agent commits on its own branch moves a ref its siblings' guards see:
    theirs (the fan-out's branches) are the run's work, not a change to the repository."""
    child = CHILD.replace("tools: [write_file, list_files]", "tools: [write_file, list_files, commit]").replace(
        "start: work", "tools:\n  commit:\n    description: Commit on this item's branch.\n"
        "    shell: git add -A && git -c user.name=a -c user.email=a@example.com commit -q -m item\nstart: work")

    def committing(turn: int, request: LlmRequest) -> Any:
        name = name_of(request)
        if turn == 1:
            return [("write_file", {"path": f"{name}.txt", "content": f"{name}\n"}), ("commit", {})]
        return "done"

    (repo / "child.yaml").write_text(child)
    (repo / "loop.yaml").write_text(PARENT)
    _git(repo, "add", "child.yaml", "loop.yaml")
    _git(repo, "commit", "-q", "-m", "loops")
    result = loopdsl.run(repo / "loop.yaml", workdir=repo, provider=Overlapping(committing))
    assert result.status == "completed", result.state.error
    assert all(i["status"] == "completed" for i in result.state.results["each"]["items"])


HOLDING_CHILD = CHILD.replace("tools: [write_file, list_files]", "tools: [write_file, hold]").replace(
    "start: work", "tools:\n  hold:\n    description: Wait while the test holds.\n"
    "    shell: while [ -f \"$TMPDIR/hold\" ]; do sleep 0.05; done\n    idempotent: true\nstart: work")
DRIVER = Path(__file__).with_name("fan_out_crash_driver.py")


def test_a_fan_out_killed_mid_way_resumes_in_the_same_item_worktrees(repo: Path, tmp_path: Path) -> None:
    """kill -9 while item b's tool holds and item a has finished: the resume reopens both
    worktrees (a is not run again), b's cut-off call reruns in its own, and both end on
    their branches as an uninterrupted run would."""
    store, temp = tmp_path / "store", tmp_path / "tmp"
    temp.mkdir()
    (temp / "hold").touch()
    (repo / "child.yaml").write_text(HOLDING_CHILD)
    (repo / "loop.yaml").write_text(PARENT.replace("['a', 'b', 'c']", "['a', 'b']"))
    _git(repo, "add", "child.yaml", "loop.yaml")
    _git(repo, "commit", "-q", "-m", "loops")
    env = dict(os.environ, TMPDIR=str(temp), PYTHONUNBUFFERED="1")
    env.pop("LOOPDSL_STORE", None)
    proc = subprocess.Popen([sys.executable, str(DRIVER), "run", str(store), str(repo)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    worktrees = store / "worktrees"
    while not (list(worktrees.glob("*--each--1/b.txt")) and _children_done(store) >= 1):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # b is inside its `hold` call
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    [run_id] = [r["run_id"] for r in RunStore(store).list_runs() if "/" not in r["run_id"] and "." not in r["run_id"]]
    assert sorted(p.name for p in worktrees.iterdir() if p.is_dir()) == sorted(
        [run_id, f"{run_id}--each--0", f"{run_id}--each--1"])  # both items' worktrees outlived the kill
    (temp / "hold").unlink()
    done = subprocess.run([sys.executable, str(DRIVER), "resume", str(store), run_id], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ended = json.loads(done.stdout.strip().splitlines()[-1])
    assert ended["status"] == "completed", ended
    for index, name in enumerate("ab"):
        item = ended["items"][index]
        assert item["status"] == "completed" and item["outputs"]["seen"] == f"{name} done"
        assert _git(repo, "show", f"{item['branch']}:{name}.txt") == f"{name}\n"
    assert _git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def _children_done(store: Path) -> int:
    """How many item runs have ended (committed `completed` in the store)."""
    try:
        runs = RunStore(store).list_runs()
    except Exception:  # noqa: BLE001 - the store is still being made by the other process
        return 0
    return sum(1 for r in runs if r.get("status") == "completed")
