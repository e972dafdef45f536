"""The built-in workspace tools on real files in real git repositories: reading (limits,
binary files, ignored files, a hostile pattern) and writing (atomic, mode kept, edit exactly
once, the post-edit hash a resume checks). Confinement: test_workspace_confinement.py."""
from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from workspace_repo import call, git, make_workspace, refused, tools_for

from loopdsl.runtime.redaction import Redactor
from loopdsl.runtime.tools.workspace import SPECS, WorkspaceTools, edit_done


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


# -- reading -------------------------------------------------------------------------------

def test_read_file_text_offset_and_limit(ws: Path) -> None:
    tools = tools_for(ws, output_limit=1 << 20)
    assert call(tools, "read_file", path="README.md").result == "hello\nworld\n"
    assert call(tools, "read_file", path="./src//app.py").result.startswith("def add")
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 2501)))
    text = call(tools, "read_file", path="long.txt").result
    assert text.count("\n") == 2000 + 0 and "line 2000\n" in text and "line 2001" not in text
    assert text.endswith("[lines 1-2000 of 2500; read on with offset=2001]")
    tail = call(tools, "read_file", path="long.txt", offset=2499, limit=10).result
    assert tail == "line 2499\nline 2500\n[lines 2499-2500 of 2500]"


def test_binary_files_give_size_and_hash(ws: Path) -> None:
    tools = tools_for(ws)
    nul = b"abc\0def" + b"x" * 100
    bad_utf8 = b"caf\xe9 au lait\n"
    (ws / "a.bin").write_bytes(nul)
    (ws / "latin1.txt").write_bytes(bad_utf8)
    for name, data in (("a.bin", nul), ("latin1.txt", bad_utf8)):
        result = call(tools, "read_file", path=name).result
        assert result == {"path": name, "binary": True, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert "a.bin" not in call(tools, "search_files", pattern="abc").result
    refused(tools, "edit_file", "binary", path="a.bin", old="abc", new="x")


def test_output_is_capped_and_redacted(ws: Path) -> None:
    (ws / "big.txt").write_text("s3cr3t-value\n" + "y" * 10_000 + "\nend\n")
    tools = tools_for(ws, output_limit=1000, redactor=Redactor(["s3cr3t-value"]))
    outcome = call(tools, "read_file", path="big.txt")
    assert outcome.ok and outcome.truncated
    assert "s3cr3t-value" not in outcome.result and "***" in outcome.result
    assert "bytes cut" in outcome.result and outcome.result.endswith("end\n")
    assert len(outcome.result.encode()) < 1100
    error = refused(tools, "read_file", "does not exist", path="s3cr3t-value/x.txt")
    assert "s3cr3t-value" not in error and "***" in error
    assert "s3cr3t-value" not in str(call(tools, "write_file", path="s3cr3t-value.txt", content="x").result)


def test_list_and_search_cover_tracked_and_untracked_not_ignored(ws: Path) -> None:
    tools = tools_for(ws)
    listed = call(tools, "list_files").result.splitlines()
    assert listed == [".gitignore", "README.md", "src/app.py", "untracked.txt"]
    assert call(tools, "list_files", path="src").result == "src/app.py"
    assert call(tools, "list_files", glob="*.py").result == "src/app.py"
    assert call(tools, "list_files", glob="src/**").result == "src/app.py"
    found = call(tools, "search_files", pattern=r"return a [-+] b").result
    assert found == "src/app.py:2:    return a - b"
    assert call(tools, "search_files", pattern="TOKEN|built").result == "(no matches)"
    refused(tools, "read_file", "read_ignored", path=".env")
    refused(tools, "read_file", "read_ignored", path="build/out.txt")
    refused(tools, "list_files", "does not exist", path="nope")
    (ws / "build" / "keep.txt").write_text("kept\n")
    git(ws, "add", "-f", "build/keep.txt")  # tracked inside an ignored folder: not ignored
    assert call(tools_for(ws), "read_file", path="build/keep.txt").result == "kept\n"
    assert "build/keep.txt" in call(tools_for(ws), "list_files").result.splitlines()


def test_unignoring_by_editing_gitignore_does_not_open_ignored_files(ws: Path) -> None:
    tools = tools_for(ws)
    assert call(tools, "write_file", path=".gitignore", content="# nothing ignored\n").ok  # the first call
    refused(tools, "read_file", "read_ignored", path=".env")
    refused(tools, "read_file", "read_ignored", path="build/out.txt")
    refused(tools, "edit_file", "read_ignored", path=".env", old="TOKEN", new="X")
    assert ".env" not in call(tools, "list_files").result.splitlines()
    assert call(tools, "search_files", pattern="TOKEN|built").result == "(no matches)"
    (ws / "build" / "later.txt").write_text("made after the start\n")  # in an ignored folder
    refused(tools, "read_file", "read_ignored", path="build/later.txt")


def test_tracked_files_are_read_without_asking_git_each_time(ws: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """git never ignores a tracked file: reading one needs no `git check-ignore` process (one a
    read, the agent bench's per-turn cost); untracked paths still ask git, at the read."""
    shims, log = tmp_path / "shims", tmp_path / "git.log"
    shims.mkdir()
    real = shutil.which("git")
    assert real is not None
    (shims / "git").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{real}" "$@"\n')
    (shims / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    tools = tools_for(ws)
    for _ in range(3):
        assert call(tools, "read_file", path="README.md").result == "hello\nworld\n"
    assert call(tools, "read_file", path="untracked.txt").result == "new\n"
    (ws / ".env.local").write_text("TOKEN=later\n")
    git(ws, "rm", "-q", "--cached", "README.md")
    (ws / ".gitignore").write_text(".env*\nbuild/\nREADME.md\n")
    refused(tools, "read_file", "read_ignored", path=".env.local")  # made and ignored after the start
    refused(tools, "read_file", "read_ignored", path=".env")
    checks = [line for line in log.read_text().splitlines() if "check-ignore" in line]
    assert [c.rsplit(" ", 1)[1] for c in checks] == ["./untracked.txt", "./.env.local"]
    assert call(tools_for(ws), "read_file", path="README.md").error.startswith("'README.md' is ignored")


def test_read_ignored_opens_ignored_files(ws: Path) -> None:
    tools = tools_for(ws, read_ignored=True)
    assert call(tools, "read_file", path=".env").result == "TOKEN=abc\n"
    assert ".env" in call(tools, "list_files").result.splitlines()
    assert call(tools, "search_files", pattern="TOKEN").result == ".env:1:TOKEN=abc"


def test_list_and_search_limits(ws: Path) -> None:
    many = ws / "many"
    many.mkdir()
    for i in range(1100):
        (many / f"f{i:04d}.txt").write_text("hit\n" if i < 300 else "miss\n")
    tools = tools_for(ws)
    listed = call(tools, "list_files", path="many").result.splitlines()
    assert len(listed) == 1001 and listed[0] == "many/f0000.txt" and listed[999] == "many/f0999.txt"
    assert listed[-1].startswith("[first 1000 entries")
    matches = call(tools, "search_files", pattern="^hit$").result.splitlines()
    assert len(matches) == 201 and matches[0] == "many/f0000.txt:1:hit" and matches[-1].startswith("[first 200 matches")


def test_hostile_regex_ends_at_its_deadline(ws: Path) -> None:
    (ws / "evil.txt").write_text("a" * 40 + "!\n")
    tools = tools_for(ws)
    started = time.monotonic()
    outcome = call(tools, "search_files", timeout=1.0, pattern=r"^(a|a)*$")  # exponential in `regex`
    assert time.monotonic() - started < 10
    assert not outcome.ok and "time limit" in outcome.error
    refused(tools, "search_files", "invalid regular expression", pattern="(unclosed")
    started = time.monotonic()
    refused(tools, "search_files", "counted repetitions", pattern="(?:a{60000}){60000}")  # compiling alone takes minutes
    refused(tools, "search_files", "characters", pattern="a" * 5000)
    assert time.monotonic() - started < 2
    assert call(tools, "search_files", pattern=r"^[a-f0-9]{1,40}\d{2}$").ok  # ordinary counts still work


def test_hostile_glob_does_not_backtrack(ws: Path) -> None:
    (ws / ("a" * 200)).write_text("x\n")
    tools = tools_for(ws)
    started = time.monotonic()
    hostile = "*a" * 40 + "*b"  # as a backtracking regular expression: ~200^40 steps
    assert call(tools, "list_files", glob=hostile).result == "(no files)"
    assert call(tools, "search_files", pattern="x", glob=hostile).result == "(no matches)"
    assert call(tools, "list_files", glob="*a" * 40).result == "a" * 200
    assert time.monotonic() - started < 5


def test_paths_narrowing(ws: Path) -> None:
    tools = tools_for(ws, paths=["src/**"])
    assert call(tools, "list_files").result == "src/app.py"
    refused(tools, "read_file", "outside the paths", path="README.md")
    refused(tools, "write_file", "outside the paths", path="new.txt", content="x")
    assert call(tools, "write_file", path="src/new.py", content="x = 1\n").ok


# -- writing ---------------------------------------------------------------------------------

def test_write_file_creates_replaces_atomically_and_keeps_mode(ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("#!/bin/sh\necho a\n")
    script.chmod(0o755)
    tools = tools_for(ws)
    outcome = call(tools, "write_file", path="run.sh", content="#!/bin/sh\necho b\n")
    assert outcome.ok and outcome.result["sha256"] == hashlib.sha256(b"#!/bin/sh\necho b\n").hexdigest()
    assert script.read_text() == "#!/bin/sh\necho b\n" and stat.S_IMODE(script.stat().st_mode) == 0o755
    assert call(tools, "write_file", path="new/deep/f.txt", content="caf\u00e9\n").ok
    assert (ws / "new" / "deep" / "f.txt").read_bytes() == "caf\u00e9\n".encode()
    refused(tools, "write_file", "directory", path="src", content="x")
    assert not [p for p in ws.rglob("*.tmp")]
    assert SPECS["write_file"].idempotent and SPECS["read_file"].idempotent and not SPECS["edit_file"].idempotent


def test_edit_file_once_twice_zero(ws: Path) -> None:
    tools = tools_for(ws)
    app = ws / "src" / "app.py"
    outcome = call(tools, "edit_file", path="src/app.py", old="a - b", new="a + b")
    assert outcome.ok and app.read_text() == "def add(a, b):\n    return a + b\n"
    after = hashlib.sha256(app.read_bytes()).hexdigest()
    assert outcome.extra["sha256"] == after == outcome.result["sha256"]
    assert edit_done(ws, "src/app.py", after) and tools.edit_done("src/app.py", after)
    refused(tools, "edit_file", "not found", path="src/app.py", old="a - b", new="a + b")  # a rerun fails
    assert app.read_text() == "def add(a, b):\n    return a + b\n"
    refused(tools, "edit_file", "more than once", path="src/app.py", old="a", new="z")
    refused(tools, "edit_file", "more than once", path="README.md", old="l", new="L")
    (ws / "aaa.txt").write_text("aaa")
    refused(tools, "edit_file", "more than once", path="aaa.txt", old="aa", new="b")  # overlapping
    refused(tools, "edit_file", "does not exist", path="missing.py", old="x", new="y")
    assert not (ws / "missing.py").exists()


def test_planned_edit_predicts_the_post_edit_hash(ws: Path) -> None:
    tools = tools_for(ws)
    args = {"path": "README.md", "old": "world", "new": "there"}
    planned = tools.planned_edit(args)
    assert planned is not None and not tools.edit_done("README.md", planned)
    assert (ws / "README.md").read_text() == "hello\nworld\n"  # planning wrote nothing
    outcome = tools.call_sync("edit_file", args, 10)
    assert outcome.extra["sha256"] == planned and tools.edit_done("README.md", planned)
    assert tools.planned_edit(args) is None  # now it would fail


def test_read_only_workspace_offers_no_writingtools_for(ws: Path) -> None:
    tools = WorkspaceTools(ws)
    assert [spec.name for spec in tools.specs()] == ["read_file", "list_files", "search_files"]
    refused(tools, "write_file", "unknown tool", path="x.txt", content="x")
    offered = WorkspaceTools(ws, tools=["read_file", "write_file"])
    refused(offered, "write_file", "worktree", path="x.txt", content="x")
    assert not (ws / "x.txt").exists()


def test_bad_arguments_are_tool_errors(ws: Path) -> None:
    tools = tools_for(ws)
    refused(tools, "read_file", "positive integer", path="README.md", offset=0)
    refused(tools, "read_file", "positive integer", path="README.md", limit=True)
    refused(tools, "write_file", "content must be a string", path="x.txt", content=None)
    refused(tools, "write_file", "surrogate", path="x.txt", content="\udcff")
    refused(tools, "edit_file", "non-empty", path="README.md", old="", new="x")
    refused(tools, "search_files", "pattern", pattern=3)
    refused(tools, "list_files", "glob must be a string", glob=["*"])
    refused(tools, "read_file", "unknown argument(s) follow", path="README.md", follow=True)
    assert not tools.call_sync("read_file", "not a mapping", 5).ok  # type: ignore[arg-type]


def test_async_call_and_close(ws: Path) -> None:
    async def main() -> None:
        tools = tools_for(ws)
        outcome = await tools.call("read_file", {"path": "README.md"}, call_id="call_1_1", timeout=5)
        assert outcome.ok and outcome.duration_s >= 0
        assert [d["function"]["name"] for d in (s.definition() for s in tools.specs())] == list(SPECS)
        await tools.aclose()

    asyncio.run(main())


def test_outside_a_git_repository_files_are_walked(tmp_path: Path) -> None:
    (tmp_path / "plain" / "x").mkdir(parents=True)
    (tmp_path / "plain" / "x" / "f.txt").write_text("found\n")
    (tmp_path / "plain" / "x" / ".git").mkdir()  # a repository inside: left out
    (tmp_path / "plain" / "g.txt").write_text("found too\n")
    tools = WorkspaceTools(tmp_path / "plain")
    assert call(tools, "list_files").result == "g.txt"
    assert call(tools, "search_files", pattern="found").result == "g.txt:1:found too"


def test_git_listing_runs_behind_the_first_turn_and_is_stopped_when_no_tool_is_called(
        ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two `git ls-files` start with the tools and are waited for by the first call; an
    attempt that ends before any call kills them rather than waiting (a hung git too)."""
    shims, pids = tmp_path / "shims", tmp_path / "pids"
    shims.mkdir()
    pids.mkdir()
    (shims / "git").write_text(f'#!/bin/sh\necho $$ > "{pids}/$$"\nexec sleep 60\n')
    (shims / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    tools = tools_for(ws)
    assert time.monotonic() - started < 5  # opening does not wait for git
    deadline = time.monotonic() + 10
    while len(list(pids.iterdir())) < 2:
        assert time.monotonic() < deadline, "both listings started"
        time.sleep(0.01)
    asyncio.run(tools.aclose())
    assert time.monotonic() - started < 10
    for pid_file in pids.iterdir():
        assert not Path(f"/proc/{int(pid_file.read_text())}").exists()  # killed and reaped


def test_a_call_on_the_event_loop_or_in_a_thread_gives_the_same_answers(ws: Path) -> None:
    """A small tracked file is read on the event loop (the thread hop costs more than the
    read); a big one, an untracked one and a tracked path swapped for a symlink go to a
    thread. Either way the answer is call_sync's."""
    (ws / "big.txt").write_text("x" * 100 + "\n" * 3000)  # 3,000 lines, ~3 KB: small
    (ws / "huge.txt").write_text(("y" * 199 + "\n") * 2000)  # 400 KB: past the inline limit
    git(ws, "add", "big.txt", "huge.txt")
    git(ws, "commit", "-q", "-m", "more")
    tools = tools_for(ws)

    def awaited(path: str) -> tuple[bool, object]:
        outcome = asyncio.run(tools.call("read_file", {"path": path}, call_id="c", timeout=30))
        return outcome.ok, outcome.result or outcome.error

    for path in ("README.md", "big.txt", "huge.txt", "untracked.txt", "missing.txt"):
        expected = call(tools, "read_file", path=path)
        assert awaited(path) == (expected.ok, expected.result or expected.error), path
    (ws / "README.md").unlink()
    (ws / "README.md").symlink_to(ws / "src" / "app.py")  # tracked name, now a symlink
    ok, answer = awaited("README.md")
    assert not ok and "symlink" in str(answer)
    asyncio.run(tools.aclose())
