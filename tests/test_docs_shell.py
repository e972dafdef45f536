"""Every ```bash block of README.md, the quick start and the tutorials runs, offline.

Blocks of one document run in sequence in one bash process with `set -e`, in a fresh
temporary folder (README.md: a copy of the repository, since it names its files). A block
preceded by a `<!-- no-test -->` line is skipped (it needs a provider key). `pip install`
commands are left out: the package is installed already.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
DOCUMENTS = [ROOT / "README.md", *TUTORIALS]
_BLOCK = re.compile(r"(?P<before>[^\n]*)\n```bash\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
_PIP = re.compile(r"(?:python3? -m )?pip3? install\b[^&;\n]*(?:&&\s*)?")
SKIPPED_DIRS = {".git", ".loopdsl", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", "__pycache__",
                ".benchmarks", "loopdsl.egg-info"}


def shell_blocks(text: str) -> list[str]:
    """The bash blocks to run, in order, with `pip install` commands removed."""
    blocks = []
    for match in _BLOCK.finditer("\n" + text):
        if match.group("before").strip() == "<!-- no-test -->":
            continue
        lines = []
        for line in match.group("body").splitlines():
            stripped = _PIP.sub("", line)
            if stripped.strip() or not line.strip():
                lines.append(stripped)
        blocks.append("\n".join(lines))
    return blocks


def test_block_extraction_honours_opt_out_and_pip() -> None:
    text = ("intro\n```bash\npython3 -m pip install -e . && echo one\n```\n"
            "<!-- no-test -->\n```bash\necho secret\n```\n```python\nprint(1)\n```\n"
            "```bash\npip install loopdsl\necho two\n```\n")
    assert shell_blocks(text) == ["echo one", "echo two"]


def _workspace(document: Path, tmp_path: Path) -> Path:
    if document.name != "README.md":
        return tmp_path
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=lambda _d, names: [n for n in names if n in SKIPPED_DIRS])
    return copy




@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_document_shell_blocks_run(document: Path, tmp_path: Path) -> None:
    blocks = shell_blocks(document.read_text(encoding="utf-8"))
    assert blocks, f"{document.name} has no bash block"
    if any(re.search(r"\bpytest\b", block) for block in blocks):
        pytest.fail(f"{document.name} runs pytest in a tested block: mark it with a preceding `<!-- no-test -->` line")
    where = _workspace(document, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPDSL_", "OPENAI", "ANTHROPIC"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = "set -e\n" + "\n".join(blocks) + "\n"
    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=where, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{document.name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
