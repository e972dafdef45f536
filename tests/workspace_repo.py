"""A real git repository to point the workspace tools at, a folder beside it they must never
touch, and the calls the workspace-tool tests share."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from loopdsl.runtime.tools.base import ToolOutcome
from loopdsl.runtime.tools.workspace import WorkspaceTools

OUTSIDE_SECRET = "OUTSIDE-SECRET-42"


def git(cwd: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")
    subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "protocol.file.allow=always", *args],
                   cwd=cwd, env=env, check=True, capture_output=True)


def make_workspace(tmp_path: Path) -> Path:
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
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    (root / "untracked.txt").write_text("new\n")
    return root


def snapshot(top: Path, skip: Path) -> dict[str, tuple]:
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


def tools_for(root: Path, **kwargs) -> WorkspaceTools:
    kwargs.setdefault("writable", True)
    return WorkspaceTools(root, **kwargs)


def call(tools: WorkspaceTools, name: str, timeout: float = 30.0, **args) -> ToolOutcome:
    outcome = tools.call_sync(name, args, timeout)
    assert OUTSIDE_SECRET not in outcome.message_content()
    return outcome


def refused(tools: WorkspaceTools, name: str, needle: str, **args) -> str:
    outcome = call(tools, name, **args)
    assert not outcome.ok, outcome
    assert needle in outcome.error, outcome.error
    return outcome.error
