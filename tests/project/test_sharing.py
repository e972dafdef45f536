"""Sharing loops between repositories: imports, sub-loops by relative path, pinning,
portability, and a kill -9 inside a child that `loopdsl resume` finishes.

Two real git repositories are made in tmp dirs from tests/data/sharing/: repo A
(`shared/gates.yaml`: gates and a model alias; `shared/loops/check.yaml`: the sub-loop,
with a skill) is cloned beside repo B, whose `loops/review.yaml` imports A's gates as
`acme.*` and runs A's check loop by relative path. The model alias points at the
loopback stub (model aliases cannot be templated, so the files are written with the
stub's address substituted). The installed-package half is in tests/test_packages.py.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import cli_in_process
from click.testing import CliRunner
from stub_server import StubServer

import loopdsl
from loopdsl.cli import cli
from loopdsl.adapters.store.run_store import RunStore

DATA = Path(__file__).parents[1] / "data" / "sharing"
STUB_PLACEHOLDER = "http://stub.invalid/v1"
OFFLINE_BASE = "http://127.0.0.1:9/v1"  # runs that use a reply script never reach it
PAUSE = "1.0"  # how long the child's slow shell state sleeps (the kill lands inside it)


# --------------------------------------------------------------------------- helpers


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=Sharing Test", "-c", "user.email=sharing@example.invalid",
         "-c", "init.defaultBranch=main", *args],
        cwd=cwd, check=True, capture_output=True, text=True,
    )
    return done.stdout


def copy_tree(source: Path, dest: Path, api_base: str) -> None:
    """Copy `source` into `dest`, pointing every model alias at `api_base`."""
    for file in sorted(source.rglob("*")):
        if file.is_dir() or "__pycache__" in file.parts:
            continue
        target = dest / file.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(file.read_text(encoding="utf-8").replace(STUB_PLACEHOLDER, api_base), encoding="utf-8")


def make_git_repo(path: Path, source: Path | None, api_base: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if source is not None:
        copy_tree(source, path, api_base)
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-q", "--allow-empty", "-m", "initial")
    return path


def two_repos(root: Path, api_base: str = OFFLINE_BASE) -> tuple[Path, Path]:
    """Repo A (published at origin/, cloned beside B) and repo B, both real git repos."""
    origin = make_git_repo(root / "origin" / "repo-a", DATA / "repo-a", api_base)
    work = root / "work"
    work.mkdir(parents=True)
    git(work, "clone", "-q", str(origin), "repo-a")
    repo_b = make_git_repo(work / "repo-b", DATA / "repo-b", api_base)
    return work / "repo-a", repo_b


def write_script(path: Path, replies: dict[str, list[str]]) -> Path:
    """A reply script (state -> replies) with fixed usage, so budgets are predictable."""
    data = {state: [{"text": t, "usage": {"prompt_tokens": 30, "completion_tokens": 20}} for t in texts]
            for state, texts in replies.items()}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def invoke(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real CLI in-process (no LiteLLM import unless a command calls a model)."""
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def launch(python: str, args: list[str], cwd: Path) -> subprocess.Popen[str]:
    """`PYTHON -m loopdsl ARGS` as its own process."""
    env = {k: v for k, v in os.environ.items() if k != "LOOPDSL_STORE"}
    env.update(PYTHONUNBUFFERED="1", LOOPDSL_USER="sharing-test")
    return subprocess.Popen([python, "-m", "loopdsl", *args], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until(reached: Callable[[], bool], proc: subprocess.Popen[str], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not reached():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def kill_9(proc: subprocess.Popen[str]) -> bool:
    """SIGKILL the process (no cleanup of any kind); True when it was still running."""
    alive = proc.poll() is None
    if alive:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    return alive


def summary_line(stdout: str) -> dict[str, Any]:
    """The `--json` summary event of a `loopdsl run/resume`."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{") and '"type": "summary"' in line:
            return json.loads(line)
    raise AssertionError(f"no summary in the output:\n{stdout}")


def prompts(stub: StubServer) -> Counter[str]:
    """Requests the stub received, per prompt (the last message's text)."""
    return Counter(str(r.body["messages"][-1]["content"]) for r in stub.requests)


def top_level_runs(store: Path) -> list[dict[str, Any]]:
    with RunStore(store) as probe:
        return [r for r in probe.list_runs() if not r.get("parent")]


def kill_inside_child_then_resume(python: str, loop: Path, cwd: Path, store: Path, marks: Path,
                                  child_states: list[str]) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """Run `loop` in its own process; each time a child in `child_states` (in order) leaves
    its marker, SIGKILL the process and resume. Returns the run id, the final `--json`
    summary and the committed record of each child at the moment of its kill.

    The resumes that are killed again are processes of their own; the last one, which runs
    to the end, runs in-process (tests/cli_in_process.py), sharing the test process's one
    LiteLLM import instead of paying its own."""
    args = ["run", str(loop), "--store", str(store), "--input", f"marks={marks}", "--input", f"pause={PAUSE}",
            "--json", "-q"]
    proc = launch(python, args, cwd)
    run_id = ""
    at_kill: list[dict[str, Any]] = []
    for number, tag in enumerate(child_states, 1):
        marker = f"{tag}.*"

        def left_its_marker(marker: str = marker) -> bool:
            return any(marks.glob(marker))

        wait_until(left_its_marker, proc, f"the marker of child '{tag}'")
        assert kill_9(proc), f"the process had ended before the kill inside child '{tag}'"
        run_id = run_id or top_level_runs(store)[0]["run_id"]
        with RunStore(store) as probe:
            parent = probe.load(run_id)
            child = probe.load(f"{run_id}.check_{tag}")
        assert parent["status"] == "running" and parent["current"] == f"check_{tag}"
        at_kill.append(child)
        if number < len(child_states):
            proc = launch(python, ["resume", run_id, "--store", str(store), "--json", "-q"], cwd)
    done = cli_in_process(["resume", run_id, "--store", str(store), "--json", "-q"], cwd,
                          {"LOOPDSL_USER": "sharing-test"})
    assert done.returncode == 0, done.stderr
    return run_id, summary_line(done.stdout), at_kill


# --------------------------------------------------------------------------- two repositories


@pytest.mark.slow
@pytest.mark.xdist_group("litellm")  # its in-process run imports LiteLLM: on the worker that has it
def test_repo_b_imports_and_runs_repo_a_loops_and_resumes_after_kill_inside_the_child(
        tmp_path: Path, stub_server: StubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo_a, repo_b = two_repos(tmp_path, stub_server.api_base)
    loop = repo_b / "loops" / "review.yaml"
    assert "../../repo-a/shared/gates.yaml" in loop.read_text()

    # Lints clean, including A's files it pulls in.
    linted = invoke(["lint", "loops"], repo_b, monkeypatch)
    assert linted.exit_code == 0, linted.output
    assert linted.stdout == ""

    # The uninterrupted run (in-process, real HTTP to the stub): the baseline.
    replies = ["a note about releases", "looks fine"]
    for text in replies:
        stub_server.reply_text(text)
    base_dir = tmp_path / "baseline"
    (base_dir / "marks").mkdir(parents=True)
    baseline = loopdsl.run(loop, {"marks": str(base_dir / "marks"), "pause": "0"}, store=base_dir / "store",
                           workdir=base_dir)
    assert baseline.status == "completed", baseline.state.error
    assert baseline.outputs == {"draft": "a note about releases", "local": "looks fine", "local_slept": "slept"}
    # A's gates ran in B's loop (as acme.stamp) and in A's child loop (as stamp): each
    # appends the id of the run it ran in, in the run's working directory.
    stamps = (base_dir / "stamps.log").read_text().split()
    assert stamps == [baseline.run_id, f"{baseline.run_id}/check_local"]
    assert prompts(stub_server) == Counter({"draft a note about releases": 1, "check[local]: a note about releases": 1})

    # The same loop as a real `loopdsl run` process, SIGKILLed inside the child's slow
    # shell state, then `loopdsl resume`d.
    stub_server.reset()
    for text in replies:
        stub_server.reply_text(text)
    marks, store = tmp_path / "marks", tmp_path / "store"
    marks.mkdir()
    run_id, final, at_kill = kill_inside_child_then_resume(sys.executable, loop, repo_b, store, marks, ["local"])
    assert at_kill[0]["status"] == "running" and at_kill[0]["current"] == "slow"
    assert at_kill[0]["parent"] == run_id and at_kill[0]["results"]["ask"]["text"] == "looks fine"

    assert final["status"] == "completed" and final["run_id"] == run_id
    assert final["outputs"] == baseline.outputs
    assert final["path"] == baseline.path
    # No LLM call paid twice: each prompt reached the stub once over run + resume.
    assert prompts(stub_server) == Counter({"draft a note about releases": 1, "check[local]: a note about releases": 1})
    assert stub_server.unscripted == 0
    assert (repo_b / "stamps.log").read_text().split() == [run_id, f"{run_id}/check_local"]
    with RunStore(store) as probe:
        child = probe.load(f"{run_id}.check_local")
    assert child["status"] == "completed" and child["parent"] == run_id
    assert len(list(marks.glob("local.*"))) == 2  # the killed slow step ran again, nothing else did


# --------------------------------------------------------------------------- imports


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


LIB_A = "gates:\n  clean: {shell: \"true\"}\n"
LIB_B = "gates:\n  clean: {expr: \"true\"}\n"


def test_import_alias_namespaces_gates_and_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo_a, repo_b = two_repos(tmp_path)
    _write(repo_b / "lib" / "a.yaml", LIB_A)
    _write(repo_b / "lib" / "b.yaml", LIB_B)
    _write(repo_b / "alias.yaml", """\
loopdsl: 1
name: alias
imports:
  - {path: lib/a.yaml, as: left}
  - {path: lib/b.yaml, as: right}
  - {path: ../repo-a/shared/gates.yaml, as: acme}
start: go
states:
  go:
    llm: {model: fast, prompt: "hello"}
    gates: {after: [left.clean, right.clean, clean]}
    next: done
  done: {end: completed}
""")
    result = invoke(["lint", "alias.yaml"], repo_b, monkeypatch)
    assert result.exit_code == 1
    assert [line for line in result.stdout.splitlines() if line.startswith("alias.yaml:")] == [
        'alias.yaml:10:18: error: state "go" uses unknown model "fast" (did you mean "acme.fast"?) [unknown-model]',
        'alias.yaml:11:46: error: unknown gate "clean" (did you mean "left.clean"?) [unknown-gate]',
    ]
    assert "(defined: acme.said_something, acme.stamp, left.clean, right.clean)" in result.stdout

    # With the prefixes the loop lints and the namespaced gates run.
    fixed = (repo_b / "alias.yaml").read_text().replace("model: fast", "model: acme.fast").replace(
        "right.clean, clean]", "right.clean, acme.stamp]")
    (repo_b / "alias.yaml").write_text(fixed)
    assert invoke(["lint", "alias.yaml"], repo_b, monkeypatch).exit_code == 0
    run = loopdsl.run(repo_b / "alias.yaml", script=write_script(tmp_path / "s.json", {"go": ["hi"]}), workdir=repo_b)
    assert run.status == "completed"
    assert (repo_b / "stamps.log").read_text().split() == [run.run_id]
    assert [e["gate"] for e in run.events if e["type"] == "gate"] == ["left.clean", "right.clean", "acme.stamp"]


def test_a_gate_of_a_library_imported_with_as_may_name_another_of_its_gates(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`outer: {ref: inner}` kept naming `inner` once the library's gates were `lib.*`: lint
    passed, and the run failed with "unknown gate 'inner'"."""
    _write(tmp_path / "lib" / "gates.yaml", "gates:\n  inner: {shell: \"test -f marker\"}\n  outer: {ref: inner}\n")
    _write(tmp_path / "loop.yaml", "loopdsl: 1\nname: uses\nimports: [{path: lib/gates.yaml, as: lib}]\nstart: a\n"
                                   "states:\n  a:\n    shell: touch marker\n    gates: {after: [lib.outer]}\n"
                                   "    next: done\n  done: {end: completed}\n")
    assert invoke(["lint", "loop.yaml"], tmp_path, monkeypatch).exit_code == 0
    result = loopdsl.run(tmp_path / "loop.yaml", workdir=tmp_path)
    assert result.status == "completed", result.state.error


def test_import_clash_shows_both_definitions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "lib" / "a.yaml", LIB_A)
    _write(tmp_path / "lib" / "b.yaml", LIB_B)
    _write(tmp_path / "clash.yaml", """\
loopdsl: 1
name: clash
imports: [lib/a.yaml, lib/b.yaml]
start: go
states:
  go: {shell: "true", gates: {after: [clean]}, next: done}
  done: {end: completed}
""")
    result = invoke(["lint", "clash.yaml"], tmp_path, monkeypatch)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        'clash.yaml:3:23: error: gate "clean" from "lib/b.yaml" clashes with another gate of that name [import-clash]',
        "   3 | imports: [lib/a.yaml, lib/b.yaml]",
        "     |                       ^",
        '  lib/a.yaml:2:3: note: first gate "clean" is defined here',
        '  lib/b.yaml:2:3: note: second gate "clean" is defined here',
        "  hint: import one of the files with `{path: lib/b.yaml, as: NAME}` to use its names as NAME.clean",
    ]


def test_import_cycle_shows_both_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "lib" / "one.yaml", "imports: [two.yaml]\ngates:\n  one: {expr: \"true\"}\n")
    _write(tmp_path / "lib" / "two.yaml", "imports: [{path: one.yaml, as: back}]\ngates:\n  two: {expr: \"true\"}\n")
    _write(tmp_path / "cycle.yaml", """\
loopdsl: 1
name: cycle
imports: [lib/one.yaml]
start: go
states:
  go: {shell: "true", gates: {after: [one, two]}, next: done}
  done: {end: completed}
""")
    result = invoke(["lint", "cycle.yaml"], tmp_path, monkeypatch)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "lib/two.yaml:1:12: error: import cycle: lib/one.yaml -> lib/two.yaml -> lib/one.yaml [import-cycle]",
        "   1 | imports: [{path: one.yaml, as: back}]",
        "     |            ^",
        '  cycle.yaml:3:11: note: "lib/one.yaml" is imported here first',
        "  hint: imports must form a tree: move the shared gates/models into a file both import",
    ]


def test_missing_import_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo_a, repo_b = two_repos(tmp_path)
    shutil.rmtree(repo_a)  # B's checkout has no A beside it
    result = invoke(["lint", "loops/review.yaml"], repo_b, monkeypatch)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == ('loops/review.yaml:11:6: error: imported file "../../repo-a/shared/gates.yaml" '
                        "does not exist [missing-file]")
    assert "  hint: the path is relative to the importing file's folder" in lines
    assert ('loops/review.yaml:23:11: error: sub-loop file "../../repo-a/shared/loops/check.yaml" '
            "does not exist [missing-file]") in lines
    # Running it says the same, without a traceback.
    ran = invoke(["run", "loops/review.yaml", "--no-store"], repo_b, monkeypatch)
    assert ran.exit_code == 2
    assert 'imported file "../../repo-a/shared/gates.yaml" does not exist' in ran.stderr
    assert "Traceback" not in ran.output


CHECKPOINT_LOOP = """\
loopdsl: 1
name: gated
imports: [{path: ../../repo-a/shared/gates.yaml, as: acme}]
start: prepare
states:
  prepare: {shell: "echo ready", gates: {after: [acme.stamp]}, next: approve}
  approve:
    checkpoint: {message: "ship it?"}
    transitions:
      - {to: done, when: "approve.decision == 'approve'"}
      - {to: stopped}
  done: {end: completed}
  stopped: {end: failed}
"""


def test_changed_import_fails_lint_locked_and_refuses_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo_a, repo_b = two_repos(tmp_path)
    _write(repo_b / "loops" / "gated.yaml", CHECKPOINT_LOOP)
    assert invoke(["lock", "loops"], repo_b, monkeypatch).exit_code == 0
    store = tmp_path / "store"
    waiting = loopdsl.run(repo_b / "loops" / "gated.yaml", store=store, workdir=repo_b)
    assert waiting.status == "waiting"
    assert invoke(["approve", waiting.run_id, "--store", str(store)], repo_b, monkeypatch).exit_code == 0

    # Team A changes its gates (and B pulls): the pin and the waiting run both notice.
    gates = repo_a / "shared" / "gates.yaml"
    gates.write_text(gates.read_text().replace("echo {{ run.id }}", "echo changed {{ run.id }}"))
    git(repo_a, "commit", "-qam", "change the stamp gate")
    locked = invoke(["lint", "--locked", "loops"], repo_b, monkeypatch)
    assert locked.exit_code == 1
    changed = [line for line in locked.stdout.splitlines() if "[lock-changed]" in line]
    assert len(changed) == 2  # both loops of B use A's gates
    assert all("'../repo-a/shared/gates.yaml' changed since loopdsl.lock was written" in line for line in changed)
    # The hint renews the lock as it was written (its paths, in its folder: `loopdsl lock` alone
    # pins loops/ only), and the summary counts what --locked found.
    assert f"hint: review the change, then run `loopdsl lock loops` in {repo_b} to pin it" in locked.stdout
    assert "2 errors, 0 warnings" in locked.stderr, locked.stderr
    as_json = invoke(["lint", "--locked", "--format", "json", "loops"], repo_b, monkeypatch)
    assert [d["rule"] for d in json.loads(as_json.stdout)] == ["lock-changed", "lock-changed"]  # one document

    refused = invoke(["resume", waiting.run_id, "--store", str(store)], repo_b, monkeypatch)
    assert refused.exit_code == 2
    assert f"loopdsl: error: changed since run {waiting.run_id} started: {gates.resolve()}" in refused.stderr
    assert "hint: resume with --force" in refused.stderr
    with RunStore(store) as probe:
        assert probe.load(waiting.run_id)["status"] == "waiting"

    forced = invoke(["resume", waiting.run_id, "--store", str(store), "--force", "-q"], repo_b, monkeypatch)
    assert forced.exit_code == 0, forced.output
    with RunStore(store) as probe:
        assert probe.load(waiting.run_id)["status"] == "completed"


# --------------------------------------------------------------------------- pinning


@pytest.mark.parametrize("text", [
    '{"loopdsl_lock": 1, "files": {"loops/review.yaml": 5}}', '{"loopdsl_lock": 1, "files": {"a": {}}}',
    '{"loopdsl_lock": 1, "files": {"a": NaN}}', "[" * 100_000 + "]" * 100_000, '{"loopdsl_lock": 99, "files": {}}',
    '{"loopdsl_lock": 1, "files": []}', "\u00ff\u00fe", "",
], ids=["int-digest", "object-digest", "nan-digest", "deep", "version-99", "files-list", "not-utf8", "empty"])
def test_a_hostile_lock_file_is_unreadable_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        text: str) -> None:
    """Digests that were not strings, a 100,000-deep document and a lock of another version were
    internal errors (TypeError, RecursionError) or silently taken for version 1."""
    _, repo_b = two_repos(tmp_path)
    (repo_b / "loopdsl.lock").write_text(text, encoding="latin-1" if text == "\u00ff\u00fe" else "utf-8")
    locked = invoke(["lint", "--locked", "loops"], repo_b, monkeypatch)
    assert locked.exit_code == 1
    (line,) = [line for line in locked.stdout.splitlines() if "[lock-unreadable]" in line]
    assert "cannot read loopdsl.lock" in line


def test_lock_replaces_a_link_and_never_blocks_on_what_is_in_the_way(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`loopdsl.lock` linked to a loop file (inside the folder: the outside check let it
    through) had the loop overwritten with the lock; a FIFO there made `lock` hang; a folder
    there was an internal error. A lock planted above the repository is not its lock."""
    _, repo_b = two_repos(tmp_path)
    loop = repo_b / "loops" / "review.yaml"
    before = loop.read_text()
    (repo_b / "loopdsl.lock").symlink_to(loop)
    assert invoke(["lock", "loops"], repo_b, monkeypatch).exit_code == 0
    assert loop.read_text() == before and not (repo_b / "loopdsl.lock").is_symlink()
    (repo_b / "loopdsl.lock").unlink()
    os.mkfifo(repo_b / "loopdsl.lock")
    assert invoke(["lock", "loops"], repo_b, monkeypatch).exit_code == 0  # replaced, not opened
    (repo_b / "loopdsl.lock").unlink()
    (repo_b / "loopdsl.lock").mkdir()
    refused = invoke(["lock", "loops"], repo_b, monkeypatch)
    assert refused.exit_code == 2 and "cannot write" in refused.stderr and "Traceback" not in refused.stderr
    (repo_b / "loopdsl.lock").rmdir()
    (tmp_path / "loopdsl.lock").write_text('{"loopdsl_lock": 1, "files": {}}')  # above repo_b's .git
    (repo_b / ".git").mkdir(exist_ok=True)
    unfound = invoke(["lint", "--locked", "loops"], repo_b, monkeypatch)
    assert unfound.exit_code == 1 and "no loopdsl.lock here or in a parent folder" in unfound.stderr


def test_lock_pins_every_file_and_show_lists_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo_a, repo_b = two_repos(tmp_path)
    written = invoke(["lock", "loops"], repo_b, monkeypatch)
    assert written.exit_code == 0 and "(1 loop(s))" in written.stdout
    lock = json.loads((repo_b / "loopdsl.lock").read_text())
    files = {
        "loops/review.yaml": repo_b / "loops" / "review.yaml",
        "../repo-a/shared/gates.yaml": repo_a / "shared" / "gates.yaml",
        "../repo-a/shared/loops/check.yaml": repo_a / "shared" / "loops" / "check.yaml",
        "../repo-a/shared/skills/check/SKILL.md": repo_a / "shared" / "skills" / "check" / "SKILL.md",
    }
    assert lock["files"] == {key: loopdsl_sha(path) for key, path in files.items()}
    assert invoke(["lint", "--locked", "loops"], repo_b, monkeypatch).exit_code == 0

    # A run records each resolved file with its sha256; `show` lists them.
    script = write_script(tmp_path / "s.json", {"draft": ["a note"], "ask": ["fine"]})
    run = loopdsl.run(repo_b / "loops" / "review.yaml", script=script, store=tmp_path / "store", workdir=repo_b)
    assert run.status == "completed"
    assert run.state.meta["files"] == {str(path.resolve()): loopdsl_sha(path) for path in files.values()}
    shown = invoke(["show", run.run_id, "--store", str(tmp_path / "store")], repo_b, monkeypatch)
    listed = shown.stdout.split("files:\n", 1)[1].splitlines()
    for path in files.values():
        assert f"  {loopdsl_sha(path)[:16]}  {path.resolve()}" in listed

    # Edit the sub-loop's skill in A: `lint --locked` names it.
    skill = repo_a / "shared" / "skills" / "check" / "SKILL.md"
    skill.write_text(skill.read_text() + "\nBe brief.\n")
    failed = invoke(["lint", "--locked", "loops"], repo_b, monkeypatch)
    assert failed.exit_code == 1
    assert failed.stdout.splitlines()[0] == (
        f"loops/review.yaml:1:1: error: '../repo-a/shared/skills/check/SKILL.md' changed since loopdsl.lock "
        f"was written (locked {lock['files']['../repo-a/shared/skills/check/SKILL.md'][:12]}, "
        f"now {loopdsl_sha(skill)[:12]}) [lock-changed]")

    # A new dependency that was never locked is `lock-missing`.
    invoke(["lock", "loops"], repo_b, monkeypatch)
    _write(repo_b / "lib" / "extra.yaml", LIB_A)
    loop = repo_b / "loops" / "review.yaml"
    loop.write_text(loop.read_text().replace("imports:\n", "imports:\n  - {path: ../lib/extra.yaml, as: extra}\n"))
    missing = invoke(["lint", "--locked", "loops"], repo_b, monkeypatch)
    assert missing.exit_code == 1
    assert ("loops/review.yaml:1:1: error: 'lib/extra.yaml' is used by this loop but not pinned in loopdsl.lock "
            "[lock-missing]") in missing.stdout.splitlines()


def loopdsl_sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- portability


def test_a_loop_folder_copied_into_another_repository_lints_locks_and_runs_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo_a, _repo_b = two_repos(tmp_path)
    shared = repo_a / "shared"
    # Pin the folder where it lives: the lock sits in the folder, paths relative to it.
    assert invoke(["lock", "loops"], shared, monkeypatch).exit_code == 0
    assert invoke(["lint", "--locked", "loops"], shared, monkeypatch).exit_code == 0

    # Copy the folder (loops, sub-loop, imports, skill, lock) into an unrelated repository.
    repo_c = make_git_repo(tmp_path / "elsewhere" / "repo-c", None, OFFLINE_BASE)
    vendored = repo_c / "ci" / "vendor" / "acme"
    shutil.copytree(shared, vendored)
    git(repo_c, "add", "-A")
    git(repo_c, "commit", "-qm", "vendor acme loops")

    for file in vendored.rglob("*"):
        if file.is_file():
            text = file.read_text(encoding="utf-8")
            assert str(tmp_path) not in text and os.sep + "work" + os.sep not in text, f"absolute path in {file}"
    lock = json.loads((vendored / "loopdsl.lock").read_text())
    assert sorted(lock["files"]) == ["gates.yaml", "loops/check.yaml", "loops/pipeline.yaml",
                                     "skills/check/SKILL.md"]

    linted = invoke(["lint", "--locked", "ci/vendor/acme/loops"], repo_c, monkeypatch)
    assert linted.exit_code == 0, linted.output
    script = write_script(tmp_path / "s.json", {"draft": ["one line"], "ask": ["fine"]})
    run = loopdsl.run(vendored / "loops" / "pipeline.yaml", script=script, store=tmp_path / "store", workdir=repo_c)
    assert run.status == "completed", run.state.error
    assert run.outputs == {"draft": "one line", "verdict": "fine"}
    assert (repo_c / "stamps.log").read_text().split() == [run.run_id, f"{run.run_id}/check"]
    assert all(path.startswith(str(vendored.resolve())) for path in run.state.meta["files"])


# --------------------------------------------------------------------------- known bugs


def test_a_run_id_prefix_is_not_ambiguous_because_of_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo_a, repo_b = two_repos(tmp_path)
    script = write_script(tmp_path / "s.json", {"draft": ["a note"], "ask": ["fine"]})
    run = loopdsl.run(repo_b / "loops" / "review.yaml", script=script, store=tmp_path / "store", workdir=repo_b)
    shown = invoke(["show", run.run_id[:5], "--store", str(tmp_path / "store")], repo_b, monkeypatch)
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.startswith(f"run {run.run_id}: completed")


# --------------------------------------------------------------------------- the user doc


def test_docs_sharing_pyproject_is_the_one_the_package_tests_build_and_its_yaml_parses() -> None:
    import re

    import tomllib
    from ruamel.yaml import YAML

    doc = (Path(__file__).resolve().parents[2] / "docs" / "sharing.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", doc, flags=re.MULTILINE | re.DOTALL)
    tomls = [body for lang, body in blocks if lang == "toml"]
    assert len(tomls) == 1
    built = tomllib.loads((DATA / "package" / "pyproject.toml").read_text(encoding="utf-8"))
    assert tomllib.loads(tomls[0]) == built  # tests/test_packages.py installs exactly this
    yamls = [body for lang, body in blocks if lang == "yaml"]
    assert len(yamls) >= 5
    for body in yamls:
        assert YAML(typ="safe").load(body) is not None


def test_an_import_or_a_sub_loop_must_be_a_yaml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop from a pull request importing /proc/self/environ (or a `.yaml` link to it) had
    lint print the runner's environment, secrets included, as the error's snippet."""
    (tmp_path / "leak.yaml").symlink_to("/proc/self/environ")
    (tmp_path / "passwd.yaml").symlink_to("/etc/passwd")
    (tmp_path / "main.yaml").write_text(
        "loopdsl: 1\nname: main\nimports: [/proc/self/environ, leak.yaml]\nstart: a\nstates:\n"
        "  a: {loop: passwd.yaml, next: done}\n  done: {end: completed}\n")
    monkeypatch.setenv("PROBE_TOKEN", "sk-probe-should-never-print-123")
    linted = invoke(["lint", "main.yaml"], tmp_path, monkeypatch)
    assert linted.exit_code == 1
    out = linted.stdout + linted.stderr
    assert "sk-probe" not in out and "root:" not in out and "PATH=" not in out
    assert out.count("is not a YAML file") == 3 and "[import-invalid]" in out and "[missing-file]" in out


def test_a_file_two_imports_share_is_not_a_clash_with_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The import-cycle hint says to move shared gates into a file both import; that diamond
    was refused as an import-clash of the shared file with itself."""
    (tmp_path / "base.yaml").write_text("gates:\n  base: {shell: \"true\"}\n")
    for side in ("left", "right"):
        (tmp_path / f"{side}.yaml").write_text(f"imports: [base.yaml]\ngates:\n  {side}: {{shell: \"true\"}}\n")
    (tmp_path / "main.yaml").write_text(
        "loopdsl: 1\nname: main\nimports: [left.yaml, right.yaml]\nstart: a\nstates:\n"
        "  a: {shell: \"true\", gates: {after: [base, left, right]}, next: done}\n  done: {end: completed}\n")
    linted = invoke(["lint", "main.yaml"], tmp_path, monkeypatch)
    assert linted.exit_code == 0, linted.stdout
    (tmp_path / "other.yaml").write_text("gates:\n  base: {shell: \"false\"}\n")  # a different gate of that name
    (tmp_path / "right.yaml").write_text("imports: [other.yaml]\ngates:\n  right: {shell: \"true\"}\n")
    clash = invoke(["lint", "main.yaml"], tmp_path, monkeypatch)
    assert clash.exit_code == 1 and "[import-clash]" in clash.stdout


def test_lint_shows_the_control_characters_of_a_hostile_file_as_escapes(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An import's path (or any text lint quotes from a file) reached the terminal raw: an
    OSC sequence retitled the window, and could write the clipboard."""
    (tmp_path / "main.yaml").write_text(
        'loopdsl: 1\nname: main\nimports: ["\\e]0;pwn\\a.yaml"]\nstart: a\nstates:\n  a: {end: completed}\n')
    for fmt in ("text", "github"):
        linted = invoke(["lint", "--format", fmt, "main.yaml"], tmp_path, monkeypatch)
        assert linted.exit_code == 1
        assert "\x1b" not in linted.stdout and "\x07" not in linted.stdout and "\\x1b]0;pwn\\x07" in linted.stdout


def test_finding_packaged_loops_runs_no_packages_code_and_survives_a_broken_one(tmp_path: Path) -> None:
    """Looking a loop up imported every loop package (running its code: `loopdsl lint` ran a
    pull request's package), and one that failed to import made every `pkg:` lookup an
    internal error."""
    import sys

    site = tmp_path / "site"
    for name, init in (("good", ""), ("boom", f"open({str(tmp_path / 'ran')!r}, 'w').close()\nraise RuntimeError('boom')\n"),
                       ("blank", "")):
        info = site / f"{name}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[loopdsl.loops]\n{name} = {'' if name == 'blank' else name + '_loops'}\n")
        (site / f"{name}_loops" / "loops").mkdir(parents=True)
        (site / f"{name}_loops" / "__init__.py").write_text(init)
        (site / f"{name}_loops" / "loops" / f"{name}-check.yaml").write_text(
            f"loopdsl: 1\nname: {name}-check\nstart: done\nstates:\n  done: {{end: completed}}\n")
    (site / "good_loops" / "loops" / "folder.yaml").mkdir()  # not a loop file
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    env["PYTHONPATH"] = str(site)
    listed = subprocess.run([sys.executable, "-m", "loopdsl", "patterns"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("pkg:")]
    assert "pkg:good-check" in names and "pkg:boom-check" in names and "pkg:folder" not in names
    assert not (tmp_path / "ran").exists()  # found on disk, never imported


def test_long_chains_of_imports_and_sub_loops_are_refused_not_a_recursion_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 500-deep import chain was an internal RecursionError; a 120-deep chain of sub-loops
    buried one in 22 kB of nested findings."""
    for i in range(1, 41):
        (tmp_path / f"l{i}.yaml").write_text(f"imports: [l{i + 1}.yaml]\ngates:\n  g{i}: {{shell: \"true\"}}\n")
    (tmp_path / "l41.yaml").write_text("gates:\n  g41: {shell: \"true\"}\n")
    (tmp_path / "main.yaml").write_text(
        "loopdsl: 1\nname: m\nimports: [l1.yaml]\nstart: a\nstates:\n  a: {end: completed}\n")
    imported = invoke(["lint", "main.yaml"], tmp_path, monkeypatch)
    assert imported.exit_code == 1 and "imports nest more than 32 files deep here [import-invalid]" in imported.stdout
    for i in range(40):
        (tmp_path / f"c{i}.yaml").write_text(f"loopdsl: 1\nname: c{i}\nunattended: true\nstart: c\nstates:\n"
                                             f"  c: {{loop: c{i + 1}.yaml, next: done}}\n  done: {{end: completed}}\n")
    (tmp_path / "c40.yaml").write_text("loopdsl: 1\nname: c40\nunattended: true\nstart: done\nstates:\n"
                                       "  done: {end: completed}\n")
    nested = invoke(["lint", "c0.yaml"], tmp_path, monkeypatch)
    assert nested.exit_code == 1 and "internal" not in nested.stdout and "Recursion" not in nested.stdout
    assert "[child-invalid]" in nested.stdout and len(nested.stdout) < 5000
    assert "sub-loops nest more than 32 levels deep here" in nested.stdout  # the cause, at the end of the nesting


AGENT_WITH_PARTS = """\
loopdsl: 1
name: ag
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 50}
tools:
  helper:
    description: Ask the helper loop.
    params: {n: {type: integer}}
    required: [n]
    loop: ../tl/helper.yaml
start: ask
states:
  ask: {checkpoint: {message: "go?"}, next: work}
  work:
    agent: {model: m, prompt: "Use the helper.", skill: ../skills/s/SKILL.md, tools: [helper], max_turns: 2}
    next: done
  done: {end: completed}
"""


def test_an_agents_skill_and_its_sub_loop_tools_are_pinned_and_checked_on_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an `llm` state's skill and `loop:` states were dependencies: an agent's edited skill
    or tool sub-loop passed `lint --locked`, and a resumed run ran the edited helper."""
    _write(tmp_path / "loops" / "ag.yaml", AGENT_WITH_PARTS)
    _write(tmp_path / "skills" / "s" / "SKILL.md", "Be brief.\n")
    _write(tmp_path / "tl" / "helper.yaml", "loopdsl: 1\nname: helper\nunattended: true\ninputs: {n: {type: integer}}\n"
                                            "start: done\nstates:\n  done: {end: completed}\n")
    assert invoke(["lock", "loops"], tmp_path, monkeypatch).exit_code == 0
    pinned = json.loads((tmp_path / "loopdsl.lock").read_text())["files"]
    assert {"loops/ag.yaml", "skills/s/SKILL.md", "tl/helper.yaml"} <= set(pinned), pinned
    store = tmp_path / "store"
    waiting = loopdsl.run(tmp_path / "loops" / "ag.yaml", store=store, workdir=tmp_path)
    assert waiting.status == "waiting"
    for edited in (tmp_path / "skills" / "s" / "SKILL.md", tmp_path / "tl" / "helper.yaml"):
        before = edited.read_text()
        edited.write_text(before + "# changed\n")
        locked = invoke(["lint", "--locked", "loops"], tmp_path, monkeypatch)
        assert locked.exit_code == 1 and "[lock-changed]" in locked.stdout, locked.stdout
        refused = invoke(["resume", waiting.run_id, "--store", str(store)], tmp_path, monkeypatch)
        assert refused.exit_code == 2 and f"changed since run {waiting.run_id} started: {edited}" in refused.stderr
        edited.write_text(before)
