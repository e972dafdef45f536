"""How fast is a cold `loopdsl lint`, beside check-jsonschema on the same files?

Usage: python bench/lint_speed.py [--runs 3] [--files 100]

Writes copies of a ~40-line loop into a temporary folder, then times (best of
--runs, each a fresh process, as a pre-commit hook or CI step would run it):
  loopdsl lint FILE            and   check-jsonschema --schemafile schemas/loop.schema.json FILE
  loopdsl lint FILE x N        and   check-jsonschema ... FILE x N
Absolute times drift with the machine's load; the ratio in the same run is the figure
to compare. check-jsonschema only validates the schema; loopdsl lint also runs every
semantic rule.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "schemas" / "loop.schema.json"

LOOP = """\
loopdsl: 1
name: bench-loop-{n}
description: Draft a change summary, review it, publish it.
inputs:
  repo: {{type: string, default: "."}}
  max_items: {{type: integer, default: 10, minimum: 1}}
models:
  writer: {{model: openai/gpt-4o-mini, temperature: 0.7, max_tokens: 800}}
  critic: {{model: anthropic/claude-haiku-4-5, temperature: 0, max_tokens: 300}}
budget: {{tokens: 50000, cost_usd: 0.25, steps: 30, wall_time: 10m}}
gates:
  non_empty: {{expr: "draft.text | length > 0"}}
start: collect
states:
  collect:
    shell: git -C {{{{ inputs.repo }}}} log --oneline -n {{{{ inputs.max_items }}}}
    timeout: 30s
    next: draft
  draft:
    llm:
      model: writer
      prompt: |
        Summarise these commits for a changelog:
        {{{{ collect.stdout }}}}
        {{% if feedback %}}Reviewer said: {{{{ feedback }}}}{{% endif %}}
    gates:
      after: [{{ref: non_empty}}]
    retry: {{max_attempts: 2}}
    max_visits: 3
    on_exhausted: give_up
    next: review
  review:
    evaluate:
      model: critic
      prompt: "Is this an accurate changelog? {{{{ draft.text }}}}"
    transitions:
      - {{to: done, when: "review.verdict == 'accept'"}}
      - {{to: draft}}
  done: {{end: completed}}
  give_up: {{end: escalated}}
"""


def best_of(runs: int, command: list[str], cwd: Path) -> tuple[float, int]:
    best, code = float("inf"), 0
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        best = min(best, time.perf_counter() - started)
        code = done.returncode
    return best, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=100)
    args = parser.parse_args()
    checker = shutil.which("check-jsonschema")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        names = []
        for n in range(args.files):
            name = f"loop_{n:03d}.yaml"
            (folder / name).write_text(LOOP.format(n=n), encoding="utf-8")
            names.append(name)
        lint = [sys.executable, "-m", "loopdsl", "lint"]
        rows = []
        for label, files in (("1 file", names[:1]), (f"{args.files} files", names)):
            ours, code = best_of(args.runs, lint + files, folder)
            if code != 0:
                print(f"loopdsl lint exited {code} on the benchmark loop: it should be clean", file=sys.stderr)
                return 1
            theirs = None
            if checker:
                theirs, _ = best_of(args.runs, [checker, "--schemafile", str(SCHEMA), *files], folder)
            rows.append((label, ours, theirs))
    lines = (LOOP.count("\n"))
    print(f"cold runs, best of {args.runs}; loop file of {lines} lines")
    print(f"{'files':>10} | {'loopdsl lint':>12} | {'check-jsonschema':>16} | ratio")
    for label, ours, theirs in rows:
        other = f"{theirs:14.3f} s" if theirs is not None else "  (not installed)"
        ratio = f"{ours / theirs:.2f}" if theirs else "-"
        print(f"{label:>10} | {ours:10.3f} s | {other} | {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
