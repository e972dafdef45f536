"""The built-in workspace tools on real files in real git repositories: every escape the
contract names is refused as a tool error (never an exception), and the file system outside
the workspace is compared byte for byte before and after."""
from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from loopdsl.runtime.redaction import Redactor
from loopdsl.runtime.tools.confined import PROTECTED_WRITE_GLOBS
from loopdsl.runtime.tools.workspace import SPECS, WorkspaceTools, edit_done

OUTSIDE_SECRET = "OUTSIDE-SECRET-42"


def _git(cwd: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")
    subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "protocol.file.allow=always", *args],
                   cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """tmp/ws a repository with a few files; tmp/outside a folder the tools must never touch."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(OUTSIDE_SECRET + "\n")
    (outside / "d").mkdir()
    (outside / "d" / "secret.txt").write_text(OUTSIDE_SECRET + "\n")
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "README.md").write_text("hello\nworld\n")
    (root / ".gitignore").write_text(".env\nbuild/\n")
    (root / ".env").write_text("TOKEN=abc\n")
    (root / "build").mkdir()
    (root / "build" / "out.txt").write_text("built\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "init")
    (root / "untracked.txt").write_text("new\n")
    return root


def _snapshot(top: Path, skip: Path) -> dict[str, tuple]:
    """Every entry under `top` except `skip`: type, content or target, mode, mtime."""
    seen: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path == skip:
                continue
            info = path.lstat()
            body = os.readlink(path) if path.is_symlink() else path.read_bytes() if stat.S_ISREG(info.st_mode) else None
            seen[str(path.relative_to(top))] = (stat.S_IFMT(info.st_mode), body, info.st_mode, info.st_mtime_ns)
    return seen


@pytest.fixture
def outside_unchanged(ws: Path):
    before = _snapshot(ws.parent, ws)
    yield
    assert _snapshot(ws.parent, ws) == before, "something outside the workspace changed"


def _tools(root: Path, **kwargs) -> WorkspaceTools:
    kwargs.setdefault("writable", True)
    return WorkspaceTools(root, **kwargs)


def _call(tools: WorkspaceTools, name: str, timeout: float = 30.0, **args):
    outcome = tools.call_sync(name, args, timeout)
    text = outcome.message_content()
    assert OUTSIDE_SECRET not in text
    return outcome


def _refused(tools: WorkspaceTools, name: str, needle: str, **args) -> str:
    outcome = _call(tools, name, **args)
    assert not outcome.ok, outcome
    assert needle in outcome.error, outcome.error
    return outcome.error


# -- reading -------------------------------------------------------------------------------

def test_read_file_text_offset_and_limit(ws: Path) -> None:
    tools = _tools(ws, output_limit=1 << 20)
    assert _call(tools, "read_file", path="README.md").result == "hello\nworld\n"
    assert _call(tools, "read_file", path="./src//app.py").result.startswith("def add")
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 2501)))
    text = _call(tools, "read_file", path="long.txt").result
    assert text.count("\n") == 2000 + 0 and "line 2000\n" in text and "line 2001" not in text
    assert text.endswith("[lines 1-2000 of 2500; read on with offset=2001]")
    tail = _call(tools, "read_file", path="long.txt", offset=2499, limit=10).result
    assert tail == "line 2499\nline 2500\n[lines 2499-2500 of 2500]"


def test_binary_files_give_size_and_hash(ws: Path) -> None:
    tools = _tools(ws)
    nul = b"abc\0def" + b"x" * 100
    bad_utf8 = b"caf\xe9 au lait\n"
    (ws / "a.bin").write_bytes(nul)
    (ws / "latin1.txt").write_bytes(bad_utf8)
    for name, data in (("a.bin", nul), ("latin1.txt", bad_utf8)):
        result = _call(tools, "read_file", path=name).result
        assert result == {"path": name, "binary": True, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert "a.bin" not in _call(tools, "search_files", pattern="abc").result
    _refused(tools, "edit_file", "binary", path="a.bin", old="abc", new="x")


def test_output_is_capped_and_redacted(ws: Path) -> None:
    (ws / "big.txt").write_text("s3cr3t-value\n" + "y" * 10_000 + "\nend\n")
    tools = _tools(ws, output_limit=1000, redact=Redactor(["s3cr3t-value"]))
    outcome = _call(tools, "read_file", path="big.txt")
    assert outcome.ok and outcome.truncated
    assert "s3cr3t-value" not in outcome.result and "***" in outcome.result
    assert "bytes cut" in outcome.result and outcome.result.endswith("end\n")
    assert len(outcome.result.encode()) < 1100


def test_list_and_search_cover_tracked_and_untracked_not_ignored(ws: Path) -> None:
    tools = _tools(ws)
    listed = _call(tools, "list_files").result.splitlines()
    assert listed == [".gitignore", "README.md", "src/app.py", "untracked.txt"]
    assert _call(tools, "list_files", path="src").result == "src/app.py"
    assert _call(tools, "list_files", glob="*.py").result == "src/app.py"
    assert _call(tools, "list_files", glob="src/**").result == "src/app.py"
    found = _call(tools, "search_files", pattern=r"return a [-+] b").result
    assert found == "src/app.py:2:    return a - b"
    assert _call(tools, "search_files", pattern="TOKEN|built").result == "(no matches)"
    _refused(tools, "read_file", "read_ignored", path=".env")
    _refused(tools, "read_file", "read_ignored", path="build/out.txt")
    _refused(tools, "list_files", "does not exist", path="nope")


def test_read_ignored_opens_ignored_files(ws: Path) -> None:
    tools = _tools(ws, read_ignored=True)
    assert _call(tools, "read_file", path=".env").result == "TOKEN=abc\n"
    assert ".env" in _call(tools, "list_files").result.splitlines()
    assert _call(tools, "search_files", pattern="TOKEN").result == ".env:1:TOKEN=abc"


def test_list_and_search_limits(ws: Path) -> None:
    many = ws / "many"
    many.mkdir()
    for i in range(1100):
        (many / f"f{i:04d}.txt").write_text("hit\n" if i < 300 else "miss\n")
    tools = _tools(ws)
    listed = _call(tools, "list_files", path="many").result.splitlines()
    assert len(listed) == 1001 and listed[0] == "many/f0000.txt" and listed[999] == "many/f0999.txt"
    assert listed[-1].startswith("[first 1000 entries")
    matches = _call(tools, "search_files", pattern="^hit$").result.splitlines()
    assert len(matches) == 201 and matches[0] == "many/f0000.txt:1:hit" and matches[-1].startswith("[first 200 matches")


def test_hostile_regex_ends_at_its_deadline(ws: Path) -> None:
    (ws / "evil.txt").write_text("a" * 40 + "!\n")
    tools = _tools(ws)
    started = time.monotonic()
    outcome = _call(tools, "search_files", timeout=1.0, pattern=r"^(a|a)*$")  # exponential in `regex`
    assert time.monotonic() - started < 10
    assert not outcome.ok and "time limit" in outcome.error
    _refused(tools, "search_files", "invalid regular expression", pattern="(unclosed")


def test_paths_narrowing(ws: Path) -> None:
    tools = _tools(ws, paths=["src/**"])
    assert _call(tools, "list_files").result == "src/app.py"
    _refused(tools, "read_file", "outside the paths", path="README.md")
    _refused(tools, "write_file", "outside the paths", path="new.txt", content="x")
    assert _call(tools, "write_file", path="src/new.py", content="x = 1\n").ok


# -- escapes ---------------------------------------------------------------------------------

@pytest.mark.usefixtures("outside_unchanged")
def test_dotdot_and_absolute_paths_are_refused(ws: Path) -> None:
    tools = _tools(ws)
    target = ws.parent / "outside" / "secret.txt"
    for path in ("../outside/secret.txt", "src/../../outside/secret.txt", "src/..", ".."):
        _refused(tools, "read_file", "'..'", path=path)
        _refused(tools, "write_file", "'..'", path=path, content="pwned")
        _refused(tools, "list_files", "'..'", path=path)
    for path in (str(target), "/etc/passwd", "C:/x", "\\\\server\\share"):
        _refused(tools, "read_file", "absolute", path=path)
        _refused(tools, "write_file", "absolute", path=path, content="pwned")
    _refused(tools, "read_file", "NUL", path="README.md\0")
    _refused(tools, "read_file", "empty", path="")
    _refused(tools, "read_file", "must be a string", path=["README.md"])
    assert not (ws.parent / "pwned").exists()


@pytest.mark.usefixtures("outside_unchanged")
def test_symlinks_are_never_followed(ws: Path) -> None:
    outside = ws.parent / "outside"
    (ws / "out").symlink_to(outside)  # a directory link out
    (ws / "secret-link.txt").symlink_to(outside / "secret.txt")  # a file link out
    (ws / "inner").symlink_to(ws / "src")  # even a link that stays inside: not followed
    tools = _tools(ws)
    for path in ("out/secret.txt", "out/d/secret.txt", "inner/app.py"):
        _refused(tools, "read_file", "symlink", path=path)
        _refused(tools, "write_file", "symlink", path=path, content="pwned")
        _refused(tools, "edit_file", "symlink", path=path, old=OUTSIDE_SECRET, new="pwned")
        _refused(tools, "list_files", "symlink", path=path.rsplit("/", 1)[0])
    _refused(tools, "read_file", "symlink", path="secret-link.txt")
    _refused(tools, "write_file", "symlink", path="secret-link.txt", content="pwned")
    _refused(tools, "edit_file", "symlink", path="secret-link.txt", old=OUTSIDE_SECRET, new="pwned")
    _refused(tools, "write_file", "symlink", path="out/new.txt", content="pwned")
    listed = _call(tools, "list_files").result.splitlines()
    assert "secret-link.txt" not in listed and not any(p.startswith(("out/", "inner/")) for p in listed)
    assert _call(tools, "search_files", pattern="SECRET").result == "(no matches)"
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
    tools = _tools(ws)
    outcomes = {"ok": 0, "refused": 0}
    try:
        for i in range(300):
            read = _call(tools, "read_file", path="d/secret.txt")
            assert not read.ok or read.result == "inside\n" or read.result.startswith("write "), read
            wrote = _call(tools, "write_file", path="d/secret.txt", content=f"write {i}\n")
            for outcome in (read, wrote):
                outcomes["ok" if outcome.ok else "refused"] += 1
    finally:
        stop.set()
        swapper.join()
        sys.setswitchinterval(old_interval)
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0, outcomes  # the race really ran
    assert not list((ws.parent / "outside" / "d").glob(".*tmp"))
    assert not swapper_errors


@pytest.mark.usefixtures("outside_unchanged")
def test_hard_links_are_refused(ws: Path) -> None:
    os.link(ws.parent / "outside" / "secret.txt", ws / "hard.txt")
    os.link(ws / "README.md", ws / "README-twin.md")
    tools = _tools(ws)
    for path in ("hard.txt", "README.md", "README-twin.md"):
        _refused(tools, "read_file", "hard links", path=path)
        _refused(tools, "write_file", "hard links", path=path, content="pwned")
        _refused(tools, "edit_file", "hard links", path=path, old="hello", new="pwned")
    assert "hard.txt" not in _call(tools, "list_files").result
    assert (ws / "README.md").read_text() == "hello\nworld\n"


def test_git_metadata_is_refused_at_any_depth_and_case(ws: Path) -> None:
    (ws / "a").mkdir()
    (ws / "a" / ".GIT").write_text("gitdir: ../../outside\n")
    hooks_before = sorted(p.name for p in (ws / ".git" / "hooks").iterdir())
    config_before = (ws / ".git" / "config").read_bytes()
    tools = _tools(ws)
    for path in (".git/config", ".GIT/config", ".Git/HEAD", "a/.git/config", "a/.GIT", ".git",
                 "x/y/.git/hooks/pre-commit", ".git./config", ".git /config", ".g\u200cit/config"):
        _refused(tools, "read_file", ".git", path=path)
        _refused(tools, "write_file", ".git", path=path, content="#!/bin/sh\necho pwned\n")
        _refused(tools, "list_files", ".git", path=path)
    _refused(tools, "write_file", ".git", path=".git/hooks/pre-commit", content="#!/bin/sh\n")
    assert sorted(p.name for p in (ws / ".git" / "hooks").iterdir()) == hooks_before
    assert (ws / ".git" / "config").read_bytes() == config_before
    assert not any("git" in line.lower().replace(".gitignore", "") for line in _call(tools, "list_files").result.splitlines())


def test_nested_repositories_and_submodules_are_refused(ws: Path) -> None:
    nested = ws / "vendor" / "lib"
    nested.mkdir(parents=True)
    (nested / "code.py").write_text("nested = True\n")
    _git(nested, "init", "-q")
    other = ws.parent / "other"
    other.mkdir()
    (other / "mod.py").write_text("sub = True\n")
    _git(other, "init", "-q")
    _git(other, "add", "-A")
    _git(other, "commit", "-qm", "init")
    _git(ws, "submodule", "add", "-q", str(other), "sub")
    tools = _tools(ws)
    for path in ("vendor/lib/code.py", "sub/mod.py"):
        _refused(tools, "read_file", "nested repository", path=path)
        _refused(tools, "write_file", "nested repository", path=path, content="pwned")
    _refused(tools, "write_file", "nested repository", path="vendor/lib/new.py", content="pwned")
    listed = _call(tools, "list_files").result.splitlines()
    assert not any(p.startswith(("vendor/", "sub")) for p in listed), listed
    assert _call(tools, "search_files", pattern="nested = True|sub = True").result == "(no matches)"
    assert (nested / "code.py").read_text() == "nested = True\n" and not (nested / "new.py").exists()
    _refused(tools, "write_file", "protected", path=".gitmodules", content="")


def test_protected_paths_need_writable(ws: Path) -> None:
    tools = _tools(ws)
    for glob in PROTECTED_WRITE_GLOBS:
        path = glob.replace("**", "deep/x.yml")
        _refused(tools, "write_file", "protected", path=path, content="pwned")
        assert not (ws / path).exists()
    _refused(tools, "write_file", "protected", path=".GITHUB/workflows/ci.yml", content="pwned")
    (ws / ".envrc").write_text("export A=1\n")
    _refused(tools, "edit_file", "protected", path=".envrc", old="A=1", new="A=2")
    assert _call(tools, "read_file", path=".envrc").ok  # reading is not protected
    allowed = _tools(ws, writable_globs=[".github/workflows/**"])
    assert _call(allowed, "write_file", path=".github/workflows/ci.yml", content="on: push\n").ok
    _refused(allowed, "write_file", "protected", path=".github/CODEOWNERS", content="*")


def test_fifo_and_device_are_never_opened(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    tools = _tools(ws)
    started = time.monotonic()
    _refused(tools, "read_file", "not a regular file", path="pipe")
    _refused(tools, "write_file", "not a regular file", path="pipe", content="x")
    _refused(tools, "edit_file", "not a regular file", path="pipe", old="a", new="b")
    assert time.monotonic() - started < 5  # opening the FIFO would have blocked
    assert "pipe" not in _call(tools, "list_files").result
    if os.geteuid() == 0:  # only root may make a device node
        os.mknod(ws / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        _refused(tools, "read_file", "not a regular file", path="null")
        _refused(tools, "write_file", "not a regular file", path="null", content="x")


# -- writing ---------------------------------------------------------------------------------

def test_write_file_creates_replaces_atomically_and_keeps_mode(ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("#!/bin/sh\necho a\n")
    script.chmod(0o755)
    tools = _tools(ws)
    outcome = _call(tools, "write_file", path="run.sh", content="#!/bin/sh\necho b\n")
    assert outcome.ok and outcome.result["sha256"] == hashlib.sha256(b"#!/bin/sh\necho b\n").hexdigest()
    assert script.read_text() == "#!/bin/sh\necho b\n" and stat.S_IMODE(script.stat().st_mode) == 0o755
    assert _call(tools, "write_file", path="new/deep/f.txt", content="caf\u00e9\n").ok
    assert (ws / "new" / "deep" / "f.txt").read_bytes() == "caf\u00e9\n".encode()
    _refused(tools, "write_file", "directory", path="src", content="x")
    assert not [p for p in ws.rglob("*.tmp")]
    assert SPECS["write_file"].idempotent and SPECS["read_file"].idempotent and not SPECS["edit_file"].idempotent


def test_edit_file_once_twice_zero(ws: Path) -> None:
    tools = _tools(ws)
    app = ws / "src" / "app.py"
    outcome = _call(tools, "edit_file", path="src/app.py", old="a - b", new="a + b")
    assert outcome.ok and app.read_text() == "def add(a, b):\n    return a + b\n"
    after = hashlib.sha256(app.read_bytes()).hexdigest()
    assert outcome.extra["sha256"] == after == outcome.result["sha256"]
    assert edit_done(ws, "src/app.py", after) and tools.edit_done("src/app.py", after)
    _refused(tools, "edit_file", "not found", path="src/app.py", old="a - b", new="a + b")  # a rerun fails
    assert app.read_text() == "def add(a, b):\n    return a + b\n"
    _refused(tools, "edit_file", "more than once", path="src/app.py", old="a", new="z")
    _refused(tools, "edit_file", "more than once", path="README.md", old="l", new="L")
    (ws / "aaa.txt").write_text("aaa")
    _refused(tools, "edit_file", "more than once", path="aaa.txt", old="aa", new="b")  # overlapping
    _refused(tools, "edit_file", "does not exist", path="missing.py", old="x", new="y")
    assert not (ws / "missing.py").exists()


def test_planned_edit_predicts_the_post_edit_hash(ws: Path) -> None:
    tools = _tools(ws)
    args = {"path": "README.md", "old": "world", "new": "there"}
    planned = tools.planned_edit(args)
    assert planned is not None and not tools.edit_done("README.md", planned)
    assert (ws / "README.md").read_text() == "hello\nworld\n"  # planning wrote nothing
    outcome = tools.call_sync("edit_file", args, 10)
    assert outcome.extra["sha256"] == planned and tools.edit_done("README.md", planned)
    assert tools.planned_edit(args) is None  # now it would fail


def test_read_only_workspace_offers_no_writing_tools(ws: Path) -> None:
    tools = WorkspaceTools(ws)
    assert [spec.name for spec in tools.specs()] == ["read_file", "list_files", "search_files"]
    _refused(tools, "write_file", "unknown tool", path="x.txt", content="x")
    offered = WorkspaceTools(ws, tools=["read_file", "write_file"])
    _refused(offered, "write_file", "worktree", path="x.txt", content="x")
    assert not (ws / "x.txt").exists()


def test_bad_arguments_are_tool_errors(ws: Path) -> None:
    tools = _tools(ws)
    _refused(tools, "read_file", "positive integer", path="README.md", offset=0)
    _refused(tools, "read_file", "positive integer", path="README.md", limit=True)
    _refused(tools, "write_file", "content must be a string", path="x.txt", content=None)
    _refused(tools, "write_file", "surrogate", path="x.txt", content="\udcff")
    _refused(tools, "edit_file", "non-empty", path="README.md", old="", new="x")
    _refused(tools, "search_files", "pattern", pattern=3)
    _refused(tools, "list_files", "glob must be a string", glob=["*"])
    assert not tools.call_sync("read_file", "not a mapping", 5).ok  # type: ignore[arg-type]


def test_async_call_and_close(ws: Path) -> None:
    async def main() -> None:
        tools = _tools(ws)
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
    assert _call(tools, "list_files").result == "g.txt"
    assert _call(tools, "search_files", pattern="found").result == "g.txt:1:found too"
