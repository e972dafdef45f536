"""Loop packages: team A's loops built into a real distribution (setuptools, entry point
group `loopdsl.loops`), installed into a throwaway venv, and used from there by name
(`pkg:NAME`) — listed by `loopdsl patterns`, run directly, and run as a sub-loop of
team B's loop, including a kill -9 inside that child and a resume.

The project is tests/data/sharing/package/pyproject.toml with repo A's `shared/`
folder copied in as the package `acme_loops` (gates.yaml, loops/, skills/). The venv sees
the packages of the interpreter running the tests (tests/outer_env.py: the loopdsl under
test and its dependencies, whether that interpreter is a venv, a conda environment or the
system's), and the install is `pip install --no-deps --no-build-isolation`: offline and a
few seconds. Nothing is installed into the interpreter running the tests.
"""
from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_in_process import cli_in_process
from click.testing import CliRunner
from outer_env import make_venv
from stub_server import StubServer
from test_sharing import (
    DATA,
    copy_tree,
    git,
    kill_inside_child_then_resume,
    prompts,
    summary_line,
    two_repos,
)

import loopdsl
from loopdsl.cli import cli
from loopdsl.adapters.store.run_store import RunStore

# The venv with the package built into it once (tests/conftest.py), in the group of the tests that
# import LiteLLM in-process (its in-process runs do): one import a run (CONTRIBUTING.md)
pytestmark = pytest.mark.xdist_group("litellm")
VERSION = "1.4.0"  # tests/data/sharing/package/pyproject.toml


@dataclass
class Installed:
    python: str  # the venv's interpreter
    site_packages: Path
    stub: StubServer  # the model alias baked into the package points here
    project: Path


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def acme(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("acme")
    stub = StubServer(host="127.0.0.1", port=0).start()
    try:
        project = root / "acme-loops"
        project.mkdir()
        shutil.copy(DATA / "package" / "pyproject.toml", project / "pyproject.toml")
        copy_tree(DATA / "repo-a" / "shared", project / "acme_loops", stub.api_base)
        (project / "acme_loops" / "__init__.py").write_text('"""Team A\'s loops."""\n')

        python = make_venv(root / "venv")
        pip = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(project)])
        assert pip.returncode == 0, "building the test package failed:\n" + pip.stdout + pip.stderr
        site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        yield Installed(python, Path(site), stub, project)
    finally:
        stub.stop()


@pytest.mark.slow
def test_patterns_lists_the_installed_loops_with_their_version(acme: Installed, tmp_path: Path) -> None:
    listed = _run([acme.python, "-m", "loopdsl", "patterns"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert ["pkg:check", "acme-loops", VERSION] in rows
    assert ["pkg:pipeline", "acme-loops", VERSION] in rows
    # The interpreter running the tests does not have the package: no leak out of the venv.
    here = CliRunner().invoke(cli, ["patterns"], catch_exceptions=False)
    assert "acme-loops" not in here.stdout
    missing = CliRunner().invoke(cli, ["run", "pkg:check", "--no-store"])
    assert missing.exit_code == 2
    assert "loopdsl: error: no installed loop package provides 'check'" in missing.stderr
    assert "`loopdsl patterns` lists them" in missing.stderr


@pytest.mark.slow
def test_an_installed_loop_runs_by_name_with_its_imports_skill_and_sub_loop(
        acme: Installed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acme.stub.reset()
    acme.stub.reply_text("one line about changelog")
    acme.stub.reply_text("fine")
    # In-process with the venv's packages visible (`patterns` above and the killed run below use
    # the venv's own interpreter): the run shares this worker's one LiteLLM import.
    monkeypatch.syspath_prepend(str(acme.site_packages))
    ran = cli_in_process(["run", "pkg:pipeline", "--no-store", "--json", "-q"], tmp_path)
    assert ran.returncode == 0, ran.stderr
    summary = summary_line(ran.stdout)
    assert summary["status"] == "completed"
    assert summary["outputs"] == {"draft": "one line about changelog", "verdict": "fine"}
    # The package's gates ran (in the working directory), in the loop and in its child.
    run_id = summary["run_id"]
    assert (tmp_path / "stamps.log").read_text().split() == [run_id, f"{run_id}/check"]
    # The child's skill (a file inside the installed package) was its system message.
    child_request = acme.stub.requests[1].body
    assert child_request["messages"][0]["role"] == "system"
    assert "# Check a draft" in child_request["messages"][0]["content"]
    assert prompts(acme.stub) == Counter({"draft a line about changelog": 1, "check[pipeline]: one line about changelog": 1})


@pytest.mark.slow
def test_repo_b_runs_the_packaged_check_as_a_sub_loop_and_resumes_after_kill_inside_it(
        acme: Installed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repo_a, repo_b = two_repos(tmp_path, acme.stub.api_base)
    shutil.copy(DATA / "package" / "review-pkg.yaml", repo_b / "loops" / "review-pkg.yaml")
    git(repo_b, "add", "-A")
    git(repo_b, "commit", "-qm", "use acme's packaged check loop")
    loop = repo_b / "loops" / "review-pkg.yaml"

    linted = _run([acme.python, "-m", "loopdsl", "lint", "loops"], cwd=repo_b)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert linted.stdout == ""
    locked = _run([acme.python, "-m", "loopdsl", "lock", "loops"], cwd=repo_b)
    assert locked.returncode == 0, locked.stderr
    assert f'"pkg:check": "acme-loops=={VERSION}"' in (repo_b / "loopdsl.lock").read_text()

    # The uninterrupted run, in-process with the venv's packages visible.
    replies = ["a note about releases", "looks fine"]
    acme.stub.reset()
    for text in replies:
        acme.stub.reply_text(text)
    monkeypatch.syspath_prepend(str(acme.site_packages))
    base_dir = tmp_path / "baseline"
    (base_dir / "marks").mkdir(parents=True)
    baseline = loopdsl.run(loop, {"marks": str(base_dir / "marks"), "pause": "0"}, store=base_dir / "store",
                           workdir=base_dir)
    assert baseline.status == "completed", baseline.state.error
    assert baseline.outputs == {"draft": "a note about releases", "pkg": "looks fine", "pkg_slept": "slept"}
    assert (base_dir / "stamps.log").read_text().split() == [baseline.run_id, f"{baseline.run_id}/check_pkg"]

    # A real `loopdsl run` in the venv, SIGKILLed inside the packaged child, then resumed.
    acme.stub.reset()
    for text in replies:
        acme.stub.reply_text(text)
    marks, store = tmp_path / "marks", tmp_path / "store"
    marks.mkdir()
    run_id, final, at_kill = kill_inside_child_then_resume(acme.python, loop, repo_b, store, marks, ["pkg"])
    assert at_kill[0]["status"] == "running" and at_kill[0]["current"] == "slow"
    assert final["status"] == "completed"
    assert final["outputs"] == baseline.outputs and final["path"] == baseline.path
    assert prompts(acme.stub) == Counter({"draft a note about releases": 1, "check[pkg]: a note about releases": 1})
    assert (repo_b / "stamps.log").read_text().split() == [run_id, f"{run_id}/check_pkg"]
    with RunStore(store) as probe:
        record = probe.load(run_id)
    assert record["meta"]["files"]["pkg:check"] == f"acme-loops=={VERSION}"
