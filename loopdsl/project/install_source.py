"""Where another machine installs the loopdsl running now: for exported workflows and the
scaffold's pre-commit hook.

loopdsl is not published on a package index, so "pip install loopdsl" is not an answer.
pip records how it installed a distribution (PEP 610, `direct_url.json`): a VCS URL with the
commit it checked out, an archive URL with its hash, or a local folder (editable or not).
The first two can be pinned exactly; a local folder exists only on this machine, so the
user must say with `--pip-spec` where CI gets loopdsl from. A distribution without that file
came from an index and is pinned by version.
"""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .schedule import ScheduleError

DIST = "loopdsl"


class InstallSourceError(ScheduleError):
    """The running loopdsl cannot be installed elsewhere as it is: `--pip-spec` is needed."""


@dataclass(frozen=True)
class InstallSource:
    pip_spec: str  # what `pip install` takes
    repo: str | None = None  # a VCS URL and commit (pre-commit's `repo:` and `rev:`), when known
    rev: str | None = None
    warning: str = ""


_VCS_SPEC = re.compile(r"^\s*loopdsl\s*@\s*git\+(?P<url>\S+?)@(?P<rev>[^@/#\s]+)(?:#\S*)?\s*$")


def from_spec(spec: str) -> InstallSource:
    """A spec the user gave; a `loopdsl @ git+URL@REV` one also gives pre-commit's repo and rev."""
    match = _VCS_SPEC.match(spec)
    return InstallSource(spec.strip(), match["url"], match["rev"]) if match else InstallSource(spec.strip())


def from_direct_url(info: dict[str, Any] | None, version: str) -> InstallSource:
    """The install source pip recorded (PEP 610), or InstallSourceError for a local one."""
    if info is None:
        return InstallSource(f"{DIST}=={version}")
    url = str(info.get("url", ""))
    local = url.startswith("file:")
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("commit_id"):
        sub = f"#subdirectory={info['subdirectory']}" if info.get("subdirectory") else ""
        spec = f"{DIST} @ {vcs.get('vcs', 'git')}+{url}@{vcs['commit_id']}{sub}"
        warning = (f"loopdsl was installed from {url}, a location only this machine can reach: the export "
                   "pins it as it is; use --pip-spec to name a URL the CI machine can clone") if local else ""
        return InstallSource(spec, url if vcs.get("vcs", "git") == "git" and not sub else None,
                             str(vcs["commit_id"]), warning)
    archive = info.get("archive_info")
    if isinstance(archive, dict) and not local:
        hashes = archive.get("hashes") or {}
        digest = archive.get("hash") or (f"sha256={hashes['sha256']}" if "sha256" in hashes else "")
        return InstallSource(f"{DIST} @ {url}" + (f"#{digest}" if digest else ""))
    what = ("an editable install of the folder" if (info.get("dir_info") or {}).get("editable")
            else "installed from the local folder" if "dir_info" in info else "installed from the local file")
    raise InstallSourceError(f"loopdsl is {what} {_file_path(url) or url}, which another machine cannot install",
                             _hint(url))


def _hint(url: str) -> str:
    """Ask for --pip-spec, spelled out from the folder's git remote and commit when it has them."""
    example = "--pip-spec 'loopdsl @ git+https://github.com/OWNER/loopdsl@COMMIT' (or 'loopdsl==VERSION')"
    folder = _file_path(url)
    if folder is not None and folder.is_dir():
        def git(*args: str) -> str:
            try:
                done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10, check=False)
            except OSError:
                return ""
            return done.stdout.strip() if done.returncode == 0 else ""

        remote, commit = git("remote", "get-url", "origin"), git("rev-parse", "HEAD")
        if remote and commit and not remote.startswith(("/", "file:")):
            example = f"--pip-spec 'loopdsl @ git+{remote}@{commit}' (this checkout's origin and commit; push it first)"
    return f"say where the CI machine installs loopdsl from: {example}"


def _file_path(url: str) -> Path | None:
    """The local path of a file: URL (percent-decoded), else None."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


def running_install() -> InstallSource:
    """How the loopdsl running now was installed, pinned; InstallSourceError when it cannot be."""
    from importlib import metadata

    import loopdsl

    # The first record an installer wrote (INSTALLER: pip, uv, ...): a setuptools egg-info in a
    # source folder on sys.path (left by a build) is not an installation.
    dist = next((d for d in metadata.distributions(name=DIST) if (d.read_text("INSTALLER") or "").strip()), None)
    running = Path(loopdsl.__file__).resolve().parent
    info = _direct_url(dist.read_text("direct_url.json")) if dist is not None else None
    if dist is not None and info is not None and "dir_info" in info:
        folder = _file_path(str(info.get("url", "")))
        if folder is not None and _is_inside(running, folder.resolve()):
            return from_direct_url(info, dist.version)  # a local folder: refused, the folder named
    # The code running must be that distribution's, not a source folder on PYTHONPATH.
    if dist is None or not _is_inside(running, Path(str(dist.locate_file(""))).resolve()):
        raise InstallSourceError(f"this loopdsl runs from the folder {running.parent} (not from an installed "
                                 "distribution), which another machine cannot install",
                                 _hint(running.parent.as_uri()))
    return from_direct_url(info, dist.version)


def _direct_url(text: str | None) -> dict[str, Any] | None:
    try:
        info = json.loads(text) if text else None
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _is_inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return True


def resolve(pip_spec: str | None) -> InstallSource:
    """`--pip-spec` when given, else the running installation."""
    return from_spec(pip_spec) if pip_spec else running_install()
