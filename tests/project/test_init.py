"""`loopdsl init`: a scaffolded project lints clean, its loop test is green, nothing is overwritten."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from loopdsl.cli import cli
from loopdsl.lint.pipeline import lint_paths, load_loop
from loopdsl.language.model import LlmAction, LoopAction
from loopdsl.project.init import list_patterns

# The loopdsl running the tests is a source folder: `init` cannot pin it for the pre-commit
# hook, so the tests say where it installs from (tests/test_install_source.py: real installs).
SPEC = "loopdsl @ git+https://github.com/example/loopdsl@0123456789abcdef0123456789abcdef01234567"
PATTERNS = ["changelog-drafter", "ci-sweeper", "daily-triage", "dependency-sweeper", "issue-triage",
            "post-merge-cleanup", "pr-babysitter"]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_list_shows_every_bundled_pattern() -> None:
    code, out, _ = invoke("init", "--list")
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines()]
    assert listed == sorted(p.name for p in list_patterns())
    assert set(PATTERNS) <= set(listed)


@pytest.mark.parametrize("name", PATTERNS)
def test_scaffold_lints_clean_and_its_loop_test_is_green(name: str, tmp_path: Path) -> None:
    target = tmp_path / name
    code, out, err = invoke("init", "--pip-spec", SPEC, str(target), "--pattern", name)
    assert code == 0, err
    loop_file = target / "loops" / f"{name}.yaml"
    for rel in (f"loops/{name}.yaml", f"loops/{name}.test.yaml", f"loops/scripts/{name}.replies.yaml",
                "README.md", ".pre-commit-config.yaml", ".gitignore", "schemas/loop.schema.json"):
        assert (target / rel).is_file(), rel
    assert ".loopdsl/" in (target / ".gitignore").read_text().split()
    report = lint_paths([target / "loops"])
    # One known warning (docs/patterns.md): the dependency bump's revert path, which lint
    # cannot see restores the files, reaches the part's `completed` end.
    problems = [d for d in report.diagnostics
                if not (d.rule == "agent-unreviewed" and d.path.endswith("parts/dependency-bump.yaml"))]
    assert problems == [], [d.message for d in problems]
    # Every path inside the copied loops resolves inside the project.
    pending = [load_loop(loop_file)]
    while pending:
        loop = pending.pop()
        for state in loop.states.values():
            if isinstance(state.action, LlmAction) and state.action.skill:
                skill = (loop.base_dir / state.action.skill).resolve()
                assert skill.is_file() and target.resolve() in skill.parents
            if isinstance(state.action, LoopAction):
                child = (loop.base_dir / state.action.path).resolve()
                assert target.resolve() in child.parents
                pending.append(load_loop(child))
    # Each kind of file points its editor at its own schema, shipped beside the loop schema.
    for rel, schema in ((f"loops/{name}.yaml", "../schemas/loop.schema.json"),
                        (f"loops/{name}.test.yaml", "../schemas/test.schema.json"),
                        (f"loops/scripts/{name}.replies.yaml", "../../schemas/replies.schema.json")):
        first = (target / rel).read_text().splitlines()[0]
        assert first == f"# yaml-language-server: $schema={schema}", rel
        assert ((target / rel).parent / schema).is_file(), schema

    code, out, _ = invoke("test", str(target))
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "1 passed, 0 failed"


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    assert invoke("init", "--pip-spec", SPEC, str(tmp_path), "--pattern", "issue-triage")[0] == 0
    readme = tmp_path / "README.md"
    readme.write_text("my own notes\n")
    code, _, err = invoke("init", "--pip-spec", SPEC, str(tmp_path), "--pattern", "issue-triage")
    assert code == 2
    assert "already has" in err and "README.md" in err and "--force" in err
    assert readme.read_text() == "my own notes\n"
    code, _, err = invoke("init", "--pip-spec", SPEC, str(tmp_path), "--pattern", "issue-triage", "--force")
    assert code == 0, err
    assert readme.read_text().startswith("# issue-triage")
    # The store ignore is appended once, never duplicated or replacing the user's lines.
    (tmp_path / ".gitignore").write_text("build/\n.loopdsl/\n")
    invoke("init", "--pip-spec", SPEC, str(tmp_path), "--pattern", "issue-triage", "--force")
    assert (tmp_path / ".gitignore").read_text() == "build/\n.loopdsl/\n"


def test_existing_gitignore_is_kept_and_extended(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("build/")
    assert invoke("init", "--pip-spec", SPEC, str(tmp_path), "--pattern", "daily-triage")[0] == 0
    lines = (tmp_path / ".gitignore").read_text().splitlines()
    assert lines[0] == "build/" and lines[-1] == ".loopdsl/"


def test_unknown_pattern_and_missing_pattern_are_usage_errors(tmp_path: Path) -> None:
    code, _, err = invoke("init", "--pip-spec", SPEC, str(tmp_path), "--pattern", "daily-triag")
    assert code == 2 and "did you mean 'daily-triage'" in err
    code, _, err = invoke("init", "--pip-spec", SPEC, str(tmp_path))
    assert code == 2 and "--pattern" in err and "daily-triage" in err
    # Without --pip-spec in this editable install: the pattern's mistake is told first (it
    # said only that --pip-spec was needed, and the pattern was refused once that was added).
    code, _, err = invoke("init", str(tmp_path), "--pattern", "daily-triag")
    assert code == 2 and "did you mean 'daily-triage'" in err, err
    assert list(tmp_path.iterdir()) == []


def test_pre_commit_config_is_valid_and_runs_lint(tmp_path: Path) -> None:
    invoke("init", "--pip-spec", SPEC, str(tmp_path), "--pattern", "daily-triage")
    config = tmp_path / ".pre-commit-config.yaml"
    done = subprocess.run([sys.executable, "-m", "pre_commit", "validate-config", str(config)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    from ruamel.yaml import YAML

    repo = YAML(typ="safe").load(config.read_text())["repos"][0]
    assert repo == {"repo": "https://github.com/example/loopdsl", "rev": "0123456789abcdef0123456789abcdef01234567",
                    "hooks": [{"id": "loopdsl-lint", "exclude": "\\.test\\.ya?ml$"}]}


def test_pre_commit_config_installs_a_version_spec_in_a_local_python_hook(tmp_path: Path) -> None:
    assert invoke("init", "--pip-spec", "loopdsl==0.1.0", str(tmp_path), "--pattern", "daily-triage")[0] == 0
    config = tmp_path / ".pre-commit-config.yaml"
    done = subprocess.run([sys.executable, "-m", "pre_commit", "validate-config", str(config)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    from ruamel.yaml import YAML

    repo = YAML(typ="safe").load(config.read_text())["repos"][0]
    assert repo["repo"] == "local"
    hook = repo["hooks"][0]
    assert hook["entry"] == "loopdsl lint" and hook["language"] == "python"
    assert hook["additional_dependencies"] == ["loopdsl==0.1.0"]


def test_init_from_a_source_folder_asks_for_pip_spec_and_writes_nothing(tmp_path: Path) -> None:
    from loopdsl.project.install_source import InstallSourceError, running_install

    try:
        running_install()
        pytest.skip("the loopdsl running the tests is pinnable (a VCS or archive install)")
    except InstallSourceError:
        pass
    code, _, err = invoke("init", str(tmp_path / "p"), "--pattern", "daily-triage")
    assert code == 2
    assert "another machine cannot install" in err and "--pip-spec" in err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("link", ["loops", ".gitignore", "README.md"])
def test_a_link_out_of_the_folder_is_refused_and_nothing_is_written(tmp_path: Path, link: str) -> None:
    """A cloned repository is hostile: a `loops` folder or a `.gitignore` that is a symbolic
    link to a file of the user's must not be written through."""
    project, outside = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    (outside / "loops").mkdir(parents=True)
    (outside / "precious").write_text("mine\n")
    (project / link).symlink_to(outside / ("loops" if link == "loops" else "precious"))
    code, _, err = invoke("init", "--pip-spec", SPEC, str(project), "--pattern", "daily-triage", "--force")
    assert code == 2, err
    assert f"{project / link}" in err and "symbolic link" in err and "nothing was written" in err
    assert (outside / "precious").read_text() == "mine\n" and list((outside / "loops").iterdir()) == []
    assert sorted(p.name for p in project.iterdir()) == [link]
    # A link that stays inside the folder is the user's own layout: followed.
    (project / link).unlink()
    (project / "shared").mkdir()
    (project / link).symlink_to("shared" if link == "loops" else "shared/file")
    code, _, err = invoke("init", "--pip-spec", SPEC, str(project), "--pattern", "daily-triage", "--force")
    assert code == 0, err


@pytest.mark.parametrize("make", ["gitignore-not-utf8", "gitignore-folder", "gitignore-fifo", "loops-file",
                                  "readme-folder", "readme-fifo"])
def test_what_is_in_the_way_is_named_and_nothing_is_written(tmp_path: Path, make: str) -> None:
    """A non-UTF-8 or folder `.gitignore`, or a file named `loops`, was an internal error after
    the other files were written; a FIFO `.gitignore` or README.md made init hang."""
    import os

    project = tmp_path / "project"
    project.mkdir()
    what, kind = make.split("-", 1)
    path = project / {"gitignore": ".gitignore", "loops": "loops", "readme": "README.md"}[what]
    if kind == "not-utf8":
        path.write_bytes(b"\xff\xfe")
    elif kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("a file where a folder goes\n")
    before = sorted(p.name for p in project.iterdir())
    code, _, err = invoke("init", "--pip-spec", SPEC, str(project), "--pattern", "daily-triage", "--force")
    assert code == 2 and "nothing was written" in err and "Traceback" not in err, err
    assert sorted(p.name for p in project.iterdir()) == before
