"""The one walk over a project's files: every command that looks for loops, tests or
dependencies skips the same folders (version control, virtual environments, vendored
packages, caches and loopdsl's own store). And the reads of the files found there or named
by a loop file, a flag or a test, each bounded: a path is hostile (a mistyped path to a huge
log, `/dev/zero`, a FIFO), and no read of one may run without end or fill the memory."""
from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
from pathlib import Path

# Folders that never hold a project's own loops, tests or their dependencies.
SKIPPED_DIRS = frozenset({
    ".git", ".hg", ".svn",  # version control
    ".venv", "venv", ".tox", "node_modules",  # installed packages
    "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis",  # caches
    ".loopdsl",  # the run store
})
YAML_SUFFIXES = (".yaml", ".yml")
# Loop files, imports, inputs, skills and scripts are a few KiB; this is far past any of them.
MAX_FILE_BYTES = 10 * 1024 * 1024
TOO_LARGE = f"it is larger than {MAX_FILE_BYTES // 2**20} MiB, more than any file loopdsl reads (is this the right path?)"
# Enough of a file's start to tell a loop file from other YAML (`loopdsl: 1` near the top).
HEAD_BYTES = 65536


def walk(root: Path, suffixes: tuple[str, ...] = ()) -> list[Path]:
    """Every file under `root` (only names ending in `suffixes`, if given), folders and
    files in sorted order, skipping SKIPPED_DIRS at any depth."""
    found: list[Path] = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        found.extend(Path(here) / f for f in sorted(files) if not suffixes or f.endswith(suffixes))
    return found


def copy_skips(folder: str, names: list[str]) -> set[str]:
    """`shutil.copytree`'s ignore for a copy of a project folder: what `walk` skips, and
    special files (a FIFO would block the copy, a socket or a device fail it)."""
    left_out = set(names) & SKIPPED_DIRS
    for name in names:
        try:
            mode = os.lstat(os.path.join(folder, name)).st_mode
        except OSError:
            left_out.add(name)
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            left_out.add(name)
    return left_out


def is_file(path: Path) -> bool:
    """Whether `path` names a regular file. A path from a loop file or the command line is
    hostile: one too long for the system (ENAMETOOLONG), or otherwise unusable, is simply
    not a file (pathlib raises for it)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def exists(path: Path) -> bool:
    """`path.exists()`, False for a path the system cannot even look up (see is_file)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    """`path.is_dir()`, False for a path the system cannot even look up (see is_file)."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _open(path: str | os.PathLike[str]) -> io.BufferedReader:
    """`path` opened for reading without blocking in open(): a FIFO nobody writes to would
    hold a plain open() forever, and so reads as empty; reads then block as usual, so a
    pipe from `<(...)` still delivers what its writer sends."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | os.PathLike[str]) -> bytes:
    """The whole file, or OSError (EFBIG, its strerror TOO_LARGE) when it holds more than
    MAX_FILE_BYTES; at most one byte more is ever read. Other OSErrors as open() raises them."""
    with _open(path) as handle:
        raw = handle.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, TOO_LARGE)
    return raw


def read_head(path: str | os.PathLike[str], size: int = HEAD_BYTES) -> bytes:
    """The first `size` bytes of a regular file (all of a shorter one); NotARegularFile for
    anything else, which a walk looking for loop files passes over."""
    with _open(path) as handle:
        _regular(handle)
        return handle.read(size)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a regular file, read in chunks (any size, little memory); OSError
    for a missing or unreadable file and for anything else (a device, a FIFO), which has no
    fixed content to pin."""
    digest = hashlib.sha256()
    with _open(path) as handle:
        _regular(handle)
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def leads_outside(root: Path, path: Path) -> Path | None:
    """Where `path` really is when a symbolic link on its way (a folder, or the file itself)
    takes it outside `root`; None when it stays inside. A cloned repository is hostile: its
    `loops` or `.gitignore` may be a link to somewhere in the user's home, and writing a
    project file must never write there."""
    real_root, real = root.resolve(), path.resolve()
    return None if real == real_root or real_root in real.parents else real


def leads_to_yaml(path: Path) -> str | None:
    """None when `path`, its links followed, names a `.yaml`/`.yml` file; else the name it
    leads to. What a loop names to import or run is a loop file: a loop from a pull request
    importing `/proc/self/environ` (or a `.yaml` link to it) had lint print the runner's
    environment in its error's snippet."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError):  # a link loop
        return path.name
    return None if target.suffix.lower() in YAML_SUFFIXES else str(target)


class NotARegularFile(OSError):
    """A device, FIFO or socket where a file's fixed content was wanted."""


def _regular(handle: io.BufferedReader) -> None:
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        raise NotARegularFile(errno.EINVAL, "not a regular file")
