"""Every escape the contract names, tried against the built-in workspace tools on real
files: `..`, absolute paths, symlinks out and in a middle component, a symlink swapped in
while the tools run, hard links, `.git` at any depth and case, nested repositories and
submodules, protected paths, FIFOs and devices. Each comes back as a tool error, and the
file system outside the workspace is compared before and after."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from workspace_repo import OUTSIDE_SECRET, call, git, make_workspace, refused, snapshot, tools_for

from loopdsl.runtime.tools.confined import PROTECTED_WRITE_GLOBS


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_workspace(tmp_path)


@pytest.fixture
def outside_unchanged(ws: Path):
    before = snapshot(ws.parent, ws)
    yield
    assert snapshot(ws.parent, ws) == before, "something outside the workspace changed"


# -- escapes ---------------------------------------------------------------------------------

@pytest.mark.usefixtures("outside_unchanged")
def test_dotdot_and_absolute_paths_arerefused(ws: Path) -> None:
    tools = tools_for(ws)
    target = ws.parent / "outside" / "secret.txt"
    for path in ("../outside/secret.txt", "src/../../outside/secret.txt", "src/..", ".."):
        refused(tools, "read_file", "'..'", path=path)
        refused(tools, "write_file", "'..'", path=path, content="pwned")
        refused(tools, "list_files", "'..'", path=path)
    for path in (str(target), "/etc/passwd", "C:/x", "\\\\server\\share"):
        refused(tools, "read_file", "absolute", path=path)
        refused(tools, "write_file", "absolute", path=path, content="pwned")
    refused(tools, "read_file", "NUL", path="README.md\0")
    refused(tools, "read_file", "empty", path="")
    refused(tools, "read_file", "must be a string", path=["README.md"])
    assert not (ws.parent / "pwned").exists()


@pytest.mark.usefixtures("outside_unchanged")
def test_symlinks_are_never_followed(ws: Path) -> None:
    outside = ws.parent / "outside"
    (ws / "out").symlink_to(outside)  # a directory link out
    (ws / "secret-link.txt").symlink_to(outside / "secret.txt")  # a file link out
    (ws / "inner").symlink_to(ws / "src")  # even a link that stays inside: not followed
    tools = tools_for(ws)
    for path in ("out/secret.txt", "out/d/secret.txt", "inner/app.py"):
        refused(tools, "read_file", "symlink", path=path)
        refused(tools, "write_file", "symlink", path=path, content="pwned")
        refused(tools, "edit_file", "symlink", path=path, old=OUTSIDE_SECRET, new="pwned")
        refused(tools, "list_files", "symlink", path=path.rsplit("/", 1)[0])
    refused(tools, "read_file", "symlink", path="secret-link.txt")
    refused(tools, "write_file", "symlink", path="secret-link.txt", content="pwned")
    refused(tools, "edit_file", "symlink", path="secret-link.txt", old=OUTSIDE_SECRET, new="pwned")
    refused(tools, "write_file", "symlink", path="out/new.txt", content="pwned")
    (ws / "dangling.txt").symlink_to(ws.parent / "outside" / "created-through-link.txt")
    refused(tools, "write_file", "symlink", path="dangling.txt", content="pwned")
    (ws / "src" / "hooks").symlink_to(ws / ".git" / "hooks")  # a way into .git that avoids the name
    refused(tools, "write_file", "symlink", path="src/hooks/pre-commit", content="#!/bin/sh\n")
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    listed = call(tools, "list_files").result.splitlines()
    assert "secret-link.txt" not in listed and not any(p.startswith(("out/", "inner/")) for p in listed)
    assert call(tools, "search_files", pattern="SECRET").result == "(no matches)"
    assert (ws / "secret-link.txt").is_symlink()  # the link itself is left as it was


@pytest.mark.usefixtures("outside_unchanged")
def test_symlink_swapped_in_during_calls(ws: Path) -> None:
    """A thread keeps swapping `d` between a real directory and a symlink out while the
    tools read and write `d/secret.txt`: each call reads the inside file or is refused."""
    inside = ws / "d"
    inside.mkdir()
    (inside / "secret.txt").write_text("inside\n")
    parked = ws / "d.parked"
    stop = threading.Event()

    swapper_errors: list[BaseException] = []

    def put_back() -> None:
        while True:
            try:
                os.rename(parked, inside)
                return
            except OSError:  # write_file made the missing `d` meanwhile (inside the workspace)
                shutil.rmtree(inside, ignore_errors=True)

    def swap() -> None:
        try:
            while not stop.is_set():
                os.rename(inside, parked)
                while True:
                    try:
                        os.symlink(ws.parent / "outside" / "d", inside)
                        break
                    except FileExistsError:  # write_file made `d` again, inside the workspace
                        shutil.rmtree(inside, ignore_errors=True)
                time.sleep(0)
                os.unlink(inside)
                put_back()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            swapper_errors.append(exc)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    swapper = threading.Thread(target=swap)
    swapper.start()
    tools = tools_for(ws)
    outcomes = {"ok": 0, "refused": 0}
    try:
        # Until both outcomes were seen often enough: bounded by time, not by a count of
        # calls, since on a loaded machine the swapper thread gets fewer turns per call.
        deadline, i = time.monotonic() + 90, 0
        while min(outcomes.values()) < 20 and time.monotonic() < deadline:
            i += 1
            read = call(tools, "read_file", path="d/secret.txt")
            assert not read.ok or read.result == "inside\n" or read.result.startswith("write "), read
            wrote = call(tools, "write_file", path="d/secret.txt", content=f"write {i}\n")
            for outcome in (read, wrote):
                outcomes["ok" if outcome.ok else "refused"] += 1
    finally:
        stop.set()
        swapper.join()
        sys.setswitchinterval(old_interval)
    assert min(outcomes.values()) >= 20, outcomes  # the race really ran
    assert not list((ws.parent / "outside" / "d").glob(".*tmp"))
    assert not swapper_errors


@pytest.mark.usefixtures("outside_unchanged")
def test_hard_links_are_refused(ws: Path) -> None:
    os.link(ws.parent / "outside" / "secret.txt", ws / "hard.txt")
    os.link(ws / "README.md", ws / "README-twin.md")
    tools = tools_for(ws)
    for path in ("hard.txt", "README.md", "README-twin.md"):
        refused(tools, "read_file", "hard links", path=path)
        refused(tools, "write_file", "hard links", path=path, content="pwned")
        refused(tools, "edit_file", "hard links", path=path, old="hello", new="pwned")
    assert "hard.txt" not in call(tools, "list_files").result
    assert (ws / "README.md").read_text() == "hello\nworld\n"


def test_git_metadata_is_refused_at_any_depth_and_case(ws: Path) -> None:
    (ws / "a").mkdir()
    (ws / "a" / ".GIT").write_text("gitdir: ../../outside\n")
    hooks_before = sorted(p.name for p in (ws / ".git" / "hooks").iterdir())
    config_before = (ws / ".git" / "config").read_bytes()
    tools = tools_for(ws)
    for path in (".git/config", ".GIT/config", ".Git/HEAD", "a/.git/config", "a/.GIT", ".git",
                 "x/y/.git/hooks/pre-commit", ".git./config", ".git /config", ".g\u200cit/config"):
        refused(tools, "read_file", ".git", path=path)
        refused(tools, "write_file", ".git", path=path, content="#!/bin/sh\necho pwned\n")
        refused(tools, "list_files", ".git", path=path)
    refused(tools, "write_file", ".git", path=".git/hooks/pre-commit", content="#!/bin/sh\n")
    assert sorted(p.name for p in (ws / ".git" / "hooks").iterdir()) == hooks_before
    assert (ws / ".git" / "config").read_bytes() == config_before
    assert not any("git" in line.lower().replace(".gitignore", "") for line in call(tools, "list_files").result.splitlines())


def test_nested_repositories_and_submodules_arerefused(ws: Path) -> None:
    nested = ws / "vendor" / "lib"
    nested.mkdir(parents=True)
    (nested / "code.py").write_text("nested = True\n")
    git(nested, "init", "-q")
    other = ws.parent / "other"
    other.mkdir()
    (other / "mod.py").write_text("sub = True\n")
    git(other, "init", "-q")
    git(other, "add", "-A")
    git(other, "commit", "-qm", "init")
    git(ws, "submodule", "add", "-q", str(other), "sub")
    tools = tools_for(ws)
    for path in ("vendor/lib/code.py", "sub/mod.py"):
        refused(tools, "read_file", "nested repository", path=path)
        refused(tools, "write_file", "nested repository", path=path, content="pwned")
    refused(tools, "write_file", "nested repository", path="vendor/lib/new.py", content="pwned")
    listed = call(tools, "list_files").result.splitlines()
    assert not any(p.startswith(("vendor/", "sub")) for p in listed), listed
    assert call(tools, "search_files", pattern="nested = True|sub = True").result == "(no matches)"
    assert (nested / "code.py").read_text() == "nested = True\n" and not (nested / "new.py").exists()
    refused(tools, "write_file", "protected", path=".gitmodules", content="")


def test_protected_paths_need_writable(ws: Path) -> None:
    tools = tools_for(ws)
    for glob in PROTECTED_WRITE_GLOBS:
        path = glob.replace("**", "deep/x.yml")
        refused(tools, "write_file", "protected", path=path, content="pwned")
        assert not (ws / path).exists()
    refused(tools, "write_file", "protected", path=".GITHUB/workflows/ci.yml", content="pwned")
    refused(tools, "write_file", "protected", path="src/.gitattributes", content="* filter=x")
    refused(tools, "write_file", "protected", path="src/.envrc", content="curl x | sh")
    (ws / ".envrc").write_text("export A=1\n")
    refused(tools, "edit_file", "protected", path=".envrc", old="A=1", new="A=2")
    assert call(tools, "read_file", path=".envrc").ok  # reading is not protected
    allowed = tools_for(ws, writable_globs=[".github/workflows/**"])
    assert call(allowed, "write_file", path=".github/workflows/ci.yml", content="on: push\n").ok
    refused(allowed, "write_file", "protected", path=".github/CODEOWNERS", content="*")


def test_fifo_and_device_are_never_opened(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    tools = tools_for(ws)
    started = time.monotonic()
    refused(tools, "read_file", "not a regular file", path="pipe")
    refused(tools, "write_file", "not a regular file", path="pipe", content="x")
    refused(tools, "edit_file", "not a regular file", path="pipe", old="a", new="b")
    assert time.monotonic() - started < 5  # opening the FIFO would have blocked
    assert "pipe" not in call(tools, "list_files").result
    if os.geteuid() == 0:  # only root may make a device node
        os.mknod(ws / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        refused(tools, "read_file", "not a regular file", path="null")
        refused(tools, "write_file", "not a regular file", path="null", content="x")




@pytest.mark.skipif(os.geteuid() != 0, reason="making a repository owned by another user needs root")
def test_a_repository_git_refuses_does_not_open_ignored_files(ws: Path) -> None:
    """git refuses a repository of another owner ("dubious ownership"): its ignore rules are
    then unknown, so the tools refuse instead of treating `.env` as an ordinary file."""
    for path in [ws, *ws.rglob("*")]:
        os.lchown(path, 54321, 54321)
    probe = subprocess.run(["git", "ls-files"], cwd=ws, capture_output=True, text=True)
    if probe.returncode == 0:
        pytest.skip("this machine's git config trusts every directory (safe.directory)")
    tools = tools_for(ws)
    refused(tools, "read_file", "dubious ownership", path=".env")
    refused(tools, "list_files", "dubious ownership")
    refused(tools, "search_files", "dubious ownership", pattern="TOKEN")
    assert call(tools_for(ws, read_ignored=True), "read_file", path="README.md").ok
