"""What the web UI tests share: a loop whose model reply is an XSS attempt, the CLI in a
subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from cli_forked import loopdsl_command

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"
LOOP = """loopdsl: 1
name: hostile
models:
  m:
    model: openai/stubby
    price: {input_per_mtok: 1.0, output_per_mtok: 2.0}
    max_tokens: 50
start: gather
states:
  gather:
    shell: {cmd: "echo facts"}
    gates:
      after: [{expr: "'facts' in gather.stdout", name: has-facts}]
    next: write
  write:
    llm: {model: m, prompt: "Write about {{ gather.stdout | trim }}"}
    next: ask
  ask:
    checkpoint: {message: "Ship {{ write.text }}?"}
    transitions:
      - {to: shipped, when: "ask.decision == 'approve'"}
      - {to: dropped}
  shipped: {end: completed, output: {said: "{{ ask.decision }} by {{ ask.by }}: {{ ask.comment }}"}}
  dropped: {end: failed}
"""
REPLIES = "write:\n  - " + repr(HOSTILE).replace("'", '"') + "\n"


def cli(args: list[str], cwd: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    environ.update(env)
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, env=environ, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, check=False)


@dataclass
class WaitingRun:
    workdir: Path
    store: Path
    run_id: str



