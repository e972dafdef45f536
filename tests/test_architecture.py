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


# Prints, at exit, the heavy stacks the command imported (the CLI's main() ends in sys.exit).
WATCH_IMPORTS = (
    "import atexit, sys\n"
    "HEAVY = {'litellm', 'opentelemetry', 'starlette', 'uvicorn', 'githubkit'}\n"
    "atexit.register(lambda: print('IMPORTED', sorted({m.split('.')[0] for m in sys.modules} & HEAVY), file=sys.stderr))\n"
    "sys.argv[0] = 'loopdsl'\n"
    "from loopdsl.cli import main\n"
    "main()\n"
)


def test_lint_graph_and_validate_import_no_model_web_or_tracing_stack(tmp_path: Path) -> None:
    """The instant commands stay instant even where tracing is configured: neither LiteLLM
    nor OpenTelemetry nor a web server stack is imported by `lint`, `graph`, `validate`."""
    loop = ROOT / "tests" / "data" / "ok" / "agent_tools.yaml"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    for args in (["lint", str(loop)], ["graph", str(loop)], ["validate", str(loop)]):
        done = subprocess.run([sys.executable, "-c", WATCH_IMPORTS, *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("IMPORTED ")]
        assert line == "IMPORTED []", (args, line)
    # The check can fail: `run` with the same variables does load OpenTelemetry.
    (tmp_path / "loop.yaml").write_text("loopdsl: 1\nname: one\nstart: a\nstates:\n"
                                        "  a: {shell: 'true', next: done}\n  done: {end: completed}\n")
    env["OTEL_BSP_EXPORT_TIMEOUT"] = "100"
    done = subprocess.run([sys.executable, "-c", WATCH_IMPORTS, "run", "loop.yaml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "IMPORTED ['opentelemetry']" in done.stderr
