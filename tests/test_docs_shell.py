"""Every ```bash block of README.md, the quick start and the tutorials runs, offline.

Blocks of one document run in sequence in one bash process with `set -e`, in a fresh
temporary folder (README.md: a copy of the repository, since it names its files). A block
preceded by a `<!-- no-test -->` line is skipped (it needs a provider key, or runs the suite).
A document's `python3 -m venv DIR` makes a real venv (`--without-pip`) that also sees the test
runner's packages, pip among them (tests/outer_env.py), and its `pip install` runs with `--no-deps
--no-build-isolation`: the commands run as written, offline and in seconds. Every `loopdsl`
command line in README.md and docs/, tested block or not, must parse (command, flags, choices).
"""
from __future__ import annotations

import compileall
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_forked import loopdsl_bin

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
DOCUMENTS = [ROOT / "README.md", *TUTORIALS]
_BLOCK = re.compile(r"(?P<before>[^\n]*)\n```bash\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
_PIP = re.compile(r"\b((?:python3? -m )?pip3? install)\b")
_VENV = re.compile(r"\b(python3? -m venv) (\S+)")
OUTER_ENV = Path(__file__).resolve().parent / "outer_env.py"
# node_modules: the test tools npm installed under tests/ (the coding CLIs alone are ~800 MB),
# which no document uses.
SKIPPED_DIRS = {".git", ".venv", "build", ".loopdsl", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", "__pycache__",
                ".benchmarks", "loopdsl.egg-info", "node_modules"}


def shell_blocks(text: str) -> list[str]:
    """The bash blocks to run, in order: venvs see the outer packages, pip installs offline."""
    blocks = []
    for match in _BLOCK.finditer("\n" + text):
        if match.group("before").strip() == "<!-- no-test -->":
            continue
        # --without-pip: the outer packages bring pip (tests/outer_env.py), installing it costs seconds.
        body = _VENV.sub(lambda m: f"{m.group(1)} --without-pip {m.group(2)} && python3 {shlex.quote(str(OUTER_ENV))} {m.group(2)}",
                         match.group("body"))
        blocks.append(_PIP.sub(r"\1 -q --no-deps --no-build-isolation", body).rstrip("\n"))
    return blocks


def test_block_extraction_honours_opt_out_and_rewrites_venv_and_pip() -> None:
    text = ("intro\n```bash\npython3 -m venv .venv && python -m pip install -e . && echo one\n```\n"
            "<!-- no-test -->\n```bash\necho secret\n```\n```python\nprint(1)\n```\n"
            "```bash\necho two\n```\n")
    assert shell_blocks(text) == [
        f"python3 -m venv --without-pip .venv && python3 {shlex.quote(str(OUTER_ENV))} .venv && "
        "python -m pip install -q --no-deps --no-build-isolation -e . && echo one", "echo two"]


def _workspace(document: Path, tmp_path: Path) -> Path:
    if document.name != "README.md":
        return tmp_path
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=_skipped)
    # The copy's bytecode is current (copytree keeps mtimes; conftest.py compiled the package);
    # compileall only rewrites what is not. Without it, under PYTHONDONTWRITEBYTECODE, each of
    # the document's `loopdsl` commands compiled every module it imports from source again.
    compileall.compile_dir(str(copy / "loopdsl"), quiet=2)
    return copy


def _skipped(folder: str, names: list[str]) -> list[str]:
    """What the copy leaves out; the package keeps its __pycache__ folders."""
    inside_package = (Path(folder) / "x").relative_to(ROOT).parts[0] == "loopdsl"
    return [n for n in names if n in SKIPPED_DIRS and not (inside_package and n == "__pycache__")]




@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_document_shell_blocks_run(document: Path, tmp_path: Path) -> None:
    blocks = shell_blocks(document.read_text(encoding="utf-8"))
    assert blocks, f"{document.name} has no bash block"
    if any(re.search(r"\bpytest\b", block) for block in blocks):
        pytest.fail(f"{document.name} runs pytest in a tested block: mark it with a preceding `<!-- no-test -->` line")
    script_text = "\n".join(blocks)
    if "pip install" in script_text and "-m venv" not in script_text.split("pip install")[0]:
        pytest.fail(f"{document.name} runs pip install outside a venv it made: it would change the test interpreter")
    where = _workspace(document, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPDSL_", "OPENAI", "ANTHROPIC"))}
    # `loopdsl` forked from a preloaded server (tests/cli_forked.py); a document's own venv, once
    # activated, comes first with its own `loopdsl`.
    env["PATH"] = os.pathsep.join([str(loopdsl_bin()), str(Path(sys.executable).parent), env.get("PATH", "")])
    # What a document keeps in the temp dir (README's `loopdsl test --keep`) goes with tmp_path.
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    script = "set -e\n" + "\n".join(blocks) + "\n"
    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=where, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{document.name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
