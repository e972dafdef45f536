"""Paths a model names, confined to the workspace: checked and opened in one operation.

A path string is only ever split into components here; the file system is then walked
from an open descriptor of the workspace root, one component at a time, each opened with
`O_NOFOLLOW` relative to its parent's descriptor (`dir_fd`). So a symlink anywhere on the
way (even one swapped in between two calls, or during this one) makes the open fail
instead of being followed, and nothing is checked by name and then opened by name again.
Only regular files and directories are opened (a FIFO would block, a device has side
effects on open); a file with more than one hard link is refused (its other name may be
outside). Writes go to a temp file in the same directory, renamed into place relative to
that directory's descriptor.

Refused by name before any file system call: absolute paths, `..`, NUL, and any `.git`
component (case-folded, with the trailing dots, spaces and invisible characters that
case-insensitive file systems ignore). Refused while walking: a directory holding a `.git`
entry (a submodule or nested repository: its hooks and config are not the run's).
"""
from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import unicodedata
from collections.abc import Sequence
from pathlib import Path

# Written only when the agent lists them in `writable`: they steer CI, git and coding tools.
# git reads `.gitattributes` and direnv reads `.envrc` in every directory, hence `**/`.
PROTECTED_WRITE_GLOBS = (".github/**", ".gitmodules", "**/.gitattributes", ".claude/**", ".codex/**",
                         ".mcp.json", ".vscode/**", "**/.envrc")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: were the type to change between lstat and open, a FIFO must not block us.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_NAME = 255


class PathRefused(Exception):
    """A path the tools will not touch; the message is what the model reads."""


def is_dot_git(component: str) -> bool:
    """`.git` as git itself protects it on NTFS/HFS+: case-folded, ignoring format
    characters (HFS+ drops zero-width joiners) and trailing dots and spaces (NTFS drops them)."""
    visible = "".join(ch for ch in component if unicodedata.category(ch) != "Cf")
    return visible.casefold().rstrip(". ") == ".git"


def split_path(path: object, *, allow_root: bool = False) -> tuple[str, ...]:
    """The components of a workspace-relative path, or PathRefused saying why not."""
    if not isinstance(path, str):
        raise PathRefused("path must be a string")
    if "\0" in path:
        raise PathRefused("path contains a NUL character")
    if path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", path):
        raise PathRefused(f"{path!r} is absolute; give a path relative to the workspace")
    parts = tuple(part for part in path.split("/") if part not in ("", "."))
    if ".." in parts:
        raise PathRefused(f"{path!r} contains '..'; paths never leave the workspace")
    if any(is_dot_git(part) for part in parts):
        raise PathRefused(f"{path!r} is inside git's metadata (.git), which tools never touch")
    if not parts and not allow_root:
        raise PathRefused("path is empty; name a file relative to the workspace")
    return parts


def _refusal(parts: Sequence[str], exc: OSError) -> PathRefused:
    shown = "/".join(parts)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return PathRefused(f"{shown!r} goes through a symlink or a non-directory; tools do not follow symlinks")
    if exc.errno == errno.ENOENT:
        return PathRefused(f"{shown!r} does not exist")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PathRefused(f"{shown!r}: permission denied")
    return PathRefused(f"{shown!r}: {exc.strerror or exc}")


class ConfinedRoot:
    """An open workspace root; every file operation goes through its descriptor."""

    def __init__(self, root: Path | str) -> None:
        self.path = Path(root)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def open_dir(self, parts: Sequence[str], *, create: bool = False) -> int:
        """A new descriptor of the directory `parts` (the caller closes it); with `create`,
        missing directories are made on the way (a symlink raced in still fails the open)."""
        fd = os.open(".", _DIR_FLAGS, dir_fd=self.fd)
        try:
            for depth, name in enumerate(parts):
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                if _has_dot_git(fd):
                    raise PathRefused(f"{'/'.join(parts[:depth + 1])!r} is a submodule or nested "
                                      "repository; tools stay in the workspace's own repository")
        except OSError as exc:
            os.close(fd)
            raise _refusal(parts, exc) from None
        except PathRefused:
            os.close(fd)
            raise
        return fd

    def kind(self, parts: Sequence[str]) -> str:
        """'file' (a regular file with one link), 'dir', or PathRefused."""
        if not parts:
            return "dir"
        dir_fd = self.open_dir(parts[:-1])
        try:
            info = os.lstat(parts[-1], dir_fd=dir_fd)
            if stat.S_ISDIR(info.st_mode):
                os.close(self.open_dir(parts))  # refuses a nested repository
                return "dir"
            _check_regular(parts, info)
            return "file"
        except OSError as exc:
            raise _refusal(parts, exc) from None
        finally:
            os.close(dir_fd)

    def read_bytes(self, parts: Sequence[str], *, max_bytes: int) -> tuple[bytes, int]:
        """The file's content (at most `max_bytes`, else PathRefused) and its size."""
        if not parts:
            raise PathRefused("the workspace root is a directory, not a file")
        dir_fd = self.open_dir(parts[:-1])
        try:
            # lstat first so a FIFO or device is never opened (opening one can have effects);
            # the fstat after the open is what decides, should the entry have changed.
            _check_regular(parts, os.lstat(parts[-1], dir_fd=dir_fd))
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise _refusal(parts, exc) from None
        finally:
            os.close(dir_fd)
        try:
            info = os.fstat(fd)
            _check_regular(parts, info)
            if info.st_size > max_bytes:
                raise PathRefused(f"{'/'.join(parts)!r} is {info.st_size} bytes; the tools read files up to {max_bytes}")
            chunks = []
            while data := os.read(fd, 1 << 20):
                chunks.append(data)
                if sum(map(len, chunks)) > max_bytes:
                    raise PathRefused(f"{'/'.join(parts)!r} grew past {max_bytes} bytes while being read")
            return b"".join(chunks), info.st_size
        finally:
            os.close(fd)

    def write_bytes(self, parts: Sequence[str], data: bytes, *, must_exist: bool = False) -> None:
        """Replace (or create) the file atomically: a temp file beside it, renamed over it."""
        if not parts:
            raise PathRefused("the workspace root is a directory, not a file")
        dir_fd = self.open_dir(parts[:-1], create=not must_exist)
        name = parts[-1]
        try:
            mode: int | None = None  # a new file gets 0o666 less the umask, as any editor's
            try:
                existing = os.lstat(name, dir_fd=dir_fd)
            except FileNotFoundError:
                if must_exist:
                    raise
            else:
                _check_regular(parts, existing)
                mode = stat.S_IMODE(existing.st_mode)
            _write_beside(dir_fd, name, data, mode)
        except OSError as exc:
            raise _refusal(parts, exc) from None
        finally:
            os.close(dir_fd)


def _has_dot_git(dir_fd: int) -> bool:
    """A `.git` entry of any type: the directory is another repository's work tree (a
    case-insensitive file system finds `.GIT` by this name too, as git would)."""
    try:
        os.lstat(".git", dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _check_regular(parts: Sequence[str], info: os.stat_result) -> None:
    shown = "/".join(parts)
    if stat.S_ISLNK(info.st_mode):
        raise PathRefused(f"{shown!r} is a symlink; tools do not follow symlinks")
    if stat.S_ISDIR(info.st_mode):
        raise PathRefused(f"{shown!r} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise PathRefused(f"{shown!r} is not a regular file (a FIFO, socket or device); tools open only regular files")
    if info.st_nlink > 1:
        raise PathRefused(f"{shown!r} has {info.st_nlink} hard links; a file with other names is refused "
                          "(one of them may be outside the workspace)")


def _write_beside(dir_fd: int, name: str, data: bytes, mode: int | None) -> None:
    temp = f".{name[:_MAX_NAME - 40]}.loopdsl-{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, _TEMP_FLAGS, 0o600 if mode is not None else 0o666, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if mode is not None:
                os.fchmod(fd, mode)  # the replaced file's mode, so an edit keeps `+x`
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
