"""Escape sequences in run data (command output, model replies) never reach the terminal raw:
`run` progress and summary, the checkpoint prompt, `show` (text and JSON) and `runs`, each
through a real `python -m loopdsl` process."""
from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from loopdsl.language.terminal_safe import visible, visible_json
from cli_forked import loopdsl_command

LOOP = Path(__file__).parents[1] / "data" / "limits" / "escapes.yaml"
# ESC, BEL, CR, C1 CSI (U+009B), SOH: what the loop's command prints; tab and newline are fine.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def loopdsl(*args: str, cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOOPDSL_STORE"}
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, **kwargs)  # type: ignore[call-overload]


def assert_inert(text: str) -> None:
    assert not RAW.search(text), repr(RAW.search(text))
    assert "\\x1b]52;c;" in text  # shown, not hidden: a person can see what the output held


def test_run_show_and_runs_print_no_raw_escapes(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    run = loopdsl("run", str(LOOP), "--store", store, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert run.returncode == 4, run.stderr  # waits at the checkpoint
    assert_inert(run.stdout + run.stderr)
    run_id = re.search(r"run (\w+): waiting", run.stderr + run.stdout).group(1)  # type: ignore[union-attr]
    shown = loopdsl("show", run_id, "--store", store, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert_inert(shown.stdout)
    as_json = loopdsl("show", run_id, "--store", store, "--json", cwd=tmp_path)
    assert not RAW.search(as_json.stdout)
    record = json.loads(as_json.stdout)  # still JSON, holding the real bytes
    assert "\x1b]52;c;aGk=\x07" in record["run"]["results"]["produce"]["stdout"]
    events = loopdsl("run", str(LOOP), "--store", store, "--json", cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert not RAW.search(events.stdout)
    assert all(json.loads(line) for line in events.stdout.splitlines())
    listed = loopdsl("runs", "--store", store, cwd=tmp_path)
    assert not RAW.search(listed.stdout)


def test_checkpoint_prompt_on_a_terminal_prints_no_raw_escapes(tmp_path: Path) -> None:
    controller, terminal = pty.openpty()
    try:
        os.write(controller, b"later\n")
        proc = loopdsl("run", str(LOOP), "--store", str(tmp_path / "store"), cwd=tmp_path, stdin=terminal)
    finally:
        os.close(terminal)
        os.close(controller)
    assert proc.returncode == 4, proc.stderr
    assert "[approve] check a" in proc.stderr  # the prompt was shown
    assert_inert(proc.stderr)


def test_visible_helpers() -> None:
    assert visible("a\x1b[2Jb\rc\x9bd\u202ee\tf\ng") == "a\\x1b[2Jb\\x0dc\\x9bd\\u202ee\tf\ng"
    text = json.dumps({"k": "\x1b\x9b\u2066"}, ensure_ascii=False)
    assert json.loads(visible_json(text)) == {"k": "\x1b\x9b\u2066"} and not RAW.search(visible_json(text))
