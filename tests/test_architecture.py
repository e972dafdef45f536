"""The layer contract in pyproject.toml holds: cli > project > api > adapters > runtime > lint
> language, and language and lint never import LiteLLM. import-linter reads the source, so
function-level imports count too."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# import-linter's console script, run in this interpreter so the checkout under test is analysed
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def test_import_contracts_hold() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--no-cache"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_a_layer_violation_is_caught(tmp_path: Path) -> None:
    """The contract can fail: a language module importing the engine breaks it."""
    subprocess.run(["cp", "-r", str(ROOT / "loopdsl"), str(ROOT / "pyproject.toml"), str(tmp_path)], check=True)
    model = tmp_path / "loopdsl" / "language" / "model.py"
    model.write_text(model.read_text(encoding="utf-8") + "\n\ndef _bad():\n    from ..runtime import engine\n",
                     encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--no-cache"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode != 0, done.stdout
    assert "loopdsl.language.model -> loopdsl.runtime.engine" in done.stdout
