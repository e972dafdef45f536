"""The nested environments of the suite (tests/outer_env.py) import exactly what the test
runner imports: from a venv (as CI runs, `.ci/run`), a conda-like prefix or the system
interpreter alike. A nested venv made with `--system-site-packages` would see the *base*
interpreter instead, whose packages differ from a venv's (or are missing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from outer_env import make_venv, outer_site_dirs

# Not setuptools or pip: a venv may bring its own.
MODULES = ["loopdsl", "ruamel.yaml", "jsonschema", "transitions", "click", "litellm", "wheel", "pre_commit"]
_WHERE = "import importlib.util, json, sys; print(json.dumps({m: importlib.util.find_spec(m).origin for m in sys.argv[1:]}))"


def _origins(python: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([python, "-c", _WHERE, *MODULES], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_a_nested_venv_imports_what_the_runner_imports(tmp_path: Path) -> None:
    assert outer_site_dirs()
    nested = make_venv(tmp_path / "venv")
    assert _origins(nested) == _origins(sys.executable)
    # Its own packages come first: an install into the nested venv shadows the runner's.
    own = subprocess.run([nested, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    (Path(own) / "click").mkdir()
    (Path(own) / "click" / "__init__.py").write_text("")
    assert _origins(nested)["click"] == str(Path(own) / "click" / "__init__.py")
