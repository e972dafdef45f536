"""Exports and scaffolds install the loopdsl that is really running (PEP 610 direct_url.json).

loopdsl is installed for real into throwaway venvs (tests/outer_env.py: they see the test
runner's dependencies, so `pip install --no-deps --no-build-isolation` is offline): from a
local git repository by URL (`git+file://...`), from an archive served over loopback HTTP,
and editable. Each venv's own `loopdsl` then exports a workflow and scaffolds a project.
"""
from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

import pytest
from outer_env import make_venv
from ruamel.yaml import YAML
from test_precommit import snapshot_of_this_checkout
from test_schedule import actionlint, lint_workflow

from loopdsl.project.install_source import InstallSourceError, from_direct_url, from_spec
from cli_forked import loopdsl_command

__all__ = ["actionlint"]  # a fixture, imported for its use below
DATA = Path(__file__).parents[1] / "data" / "project"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("install-source")]  # its module fixtures: once, on one worker


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("LOOPDSL_")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A git repository holding this checkout's files, and its commit."""
    repo = snapshot_of_this_checkout(tmp_path_factory.mktemp("src") / "loopdsl")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    return repo, commit


def _venv_with(root: Path, *install: str) -> str:
    python = make_venv(root / "venv")
    done = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *install], cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(DATA / "strong", project)
    return project


def _install_step(workflow: Path) -> str:
    steps = YAML(typ="safe").load(workflow.read_text())["jobs"]["run"]["steps"]
    return next(s["run"] for s in steps if s.get("name") == "Install loopdsl")


def test_a_git_url_install_is_exported_pinned_to_its_commit(source: tuple[Path, str], tmp_path: Path,
                                                            actionlint: Path) -> None:
    repo, commit = source
    url = repo.as_uri()  # file:///...
    python = _venv_with(tmp_path, f"git+{url}@{commit}")
    project = _project(tmp_path)
    workflow = tmp_path / "notes.yml"
    done = _run([python, "-m", "loopdsl", "schedule", "loops/notes.yaml", "--export", "github-actions",
                 "-o", str(workflow)], cwd=project)
    assert done.returncode == 0, done.stderr
    # The jobs talk to GitHub: the pinned install gets the `github` extra.
    assert _install_step(workflow) == f"python -m pip install 'loopdsl[github] @ git+{url}@{commit}'"
    assert "only this machine can reach" in done.stderr  # a file:// URL: said, not hidden
    assert lint_workflow(actionlint, workflow) == []

    made = _run([python, "-m", "loopdsl", "init", "scaffold", "--pattern", "daily-triage"], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    config = YAML(typ="safe").load((tmp_path / "scaffold" / ".pre-commit-config.yaml").read_text())
    assert config["repos"][0]["repo"] == url and config["repos"][0]["rev"] == commit
    assert [h["id"] for h in config["repos"][0]["hooks"]] == ["loopdsl-lint"]
    valid = _run([python, "-m", "pre_commit", "validate-config", ".pre-commit-config.yaml"], cwd=tmp_path / "scaffold")
    assert valid.returncode == 0, valid.stdout + valid.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, source: tuple[Path, str]) -> Iterator[str]:
    """A wheel of this checkout, served over loopback HTTP; yields its URL. Built once for the
    module (seconds of pip): the tests only download it."""
    dist = tmp_path_factory.mktemp("dist")
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                  "-w", str(dist), str(source[0])], cwd=dist)
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("loopdsl-*.whl")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(dist))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{wheel.name}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_archive_url_install_is_exported_with_its_hash(served: str, tmp_path: Path, actionlint: Path) -> None:
    python = _venv_with(tmp_path, served)
    project = _project(tmp_path)
    workflow = tmp_path / "notes.yml"
    done = _run([python, "-m", "loopdsl", "schedule", "loops/notes.yaml", "--export", "github-actions",
                 "-o", str(workflow)], cwd=project)
    assert done.returncode == 0, done.stderr
    # pip records the archive's hash (recent pip always; older pip only when the URL had one).
    digest = hashlib.sha256(urlopen(served).read()).hexdigest()
    assert _install_step(workflow) in (f"python -m pip install 'loopdsl[github] @ {served}#sha256={digest}'",
                                       f"python -m pip install 'loopdsl[github] @ {served}'")
    assert lint_workflow(actionlint, workflow) == []


def test_an_editable_install_is_refused_until_pip_spec_says_where_ci_gets_it(source: tuple[Path, str],
                                                                            tmp_path: Path) -> None:
    repo, _ = source
    python = _venv_with(tmp_path, "-e", str(repo))
    project = _project(tmp_path)
    refused = _run([python, "-m", "loopdsl", "schedule", "loops/notes.yaml", "--export", "github-actions"], cwd=project)
    assert refused.returncode == 2
    assert f"loopdsl: error: loopdsl is an editable install of the folder {repo}" in refused.stderr
    assert "hint:" in refused.stderr and "--pip-spec" in refused.stderr and "Traceback" not in refused.stderr
    assert refused.stdout == ""
    scaffold = _run([python, "-m", "loopdsl", "init", "s", "--pattern", "daily-triage"], cwd=tmp_path)
    assert scaffold.returncode == 2 and "--pip-spec" in scaffold.stderr and not (tmp_path / "s").exists()

    spec = "loopdsl @ git+https://github.com/example/loopdsl@v0.1.0"
    workflow = tmp_path / "notes.yml"
    given = _run([python, "-m", "loopdsl", "schedule", "loops/notes.yaml", "--export", "github-actions",
                  "--pip-spec", spec, "-o", str(workflow)], cwd=project)
    assert given.returncode == 0, given.stderr
    assert _install_step(workflow) == "python -m pip install 'loopdsl[github] @ git+https://github.com/example/loopdsl@v0.1.0'"


def test_the_hint_spells_out_the_checkouts_remote_and_commit(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=clone, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/someone/loopdsl"], cwd=clone, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty",
                    "-m", "x"], cwd=clone, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True).stdout.strip()
    with pytest.raises(InstallSourceError) as refused:
        from_direct_url({"url": clone.as_uri(), "dir_info": {"editable": True}}, "0.1.0")
    assert f"--pip-spec 'loopdsl @ git+https://github.com/someone/loopdsl@{head}'" in refused.value.hint


def test_specs_the_user_gives_and_records_pip_wrote() -> None:
    assert from_spec("loopdsl @ git+https://github.com/a/loopdsl@abc").repo == "https://github.com/a/loopdsl"
    assert from_spec("loopdsl==0.1.0").repo is None
    assert from_direct_url(None, "0.3.1").pip_spec == "loopdsl==0.3.1"  # from an index: its version
    with pytest.raises(InstallSourceError, match="installed from the local file"):
        from_direct_url({"url": "file:///tmp/loopdsl-0.1.0.tar.gz", "archive_info": {}}, "0.1.0")
    with pytest.raises(InstallSourceError, match="installed from the local folder"):
        from_direct_url({"url": "file:///tmp/loopdsl", "dir_info": {}}, "0.1.0")


def test_the_scaffolds_local_python_hook_installs_the_spec_and_lints(served: str, tmp_path: Path) -> None:
    from test_precommit import DATA as LINT_DATA
    from test_precommit import git, pre_commit

    spec = f"loopdsl @ {served}"
    project = tmp_path / "proj"
    made = subprocess.run([*loopdsl_command(), "init", str(project), "--pattern", "daily-triage",
                           "--pip-spec", spec], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0, made.stderr
    hook = YAML(typ="safe").load((project / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"][0]
    assert hook["additional_dependencies"] == [spec]
    shutil.copy(LINT_DATA / "err" / "unknown_state.yaml", project / "loops" / "bad.yaml")
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "scaffold")
    # pre-commit pip-installs the spec from the loopback server into its own environment.
    failing = pre_commit(project, tmp_path / "pre-commit-home", "run", "--all-files")
    output = failing.stdout + failing.stderr
    assert failing.returncode == 1, output
    assert 'loops/bad.yaml:10:11: error: next of state "draft" names unknown state "dnoe"' in output
    (project / "loops" / "bad.yaml").unlink()
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "fix")
    passing = pre_commit(project, tmp_path / "pre-commit-home", "run", "--all-files")
    assert passing.returncode == 0, passing.stdout + passing.stderr
