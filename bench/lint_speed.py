"""How fast is a cold `loopdsl lint`, beside check-jsonschema on the same files?

Usage: python bench/lint_speed.py [--runs 3] [--files 100]

Writes copies of a ~40-line loop into a temporary folder, then times (best of
--runs, each a fresh process, as a pre-commit hook or CI step would run it):
  loopdsl lint FILE            and   check-jsonschema --schemafile schemas/loop.schema.json FILE
  loopdsl lint FILE x N        and   check-jsonschema ... FILE x N
Absolute times drift with the machine's load; the ratio in the same run is the figure
to compare. The CPU columns (user + system time of the command and every process it
waited for, best of --runs) move much less with load than wall time does, so on a busy
machine they are the steadier comparison; lint on many files uses several processes,
so its CPU time can exceed its wall time. check-jsonschema only validates the schema;
loopdsl lint also runs every semantic rule.

With PYTHONDONTWRITEBYTECODE set (as on some CI and sandbox machines), every loopdsl run
compiles loopdsl's own modules from source (~0.1 s) while check-jsonschema's were
compiled by pip at install time; --bytecode-cache lets the timed processes keep their
bytecode in a temporary folder, which is what an installed loopdsl does.
"""
from __future__ import annotations

import argparse
import os
import resource
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


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def best_of(runs: int, command: list[str], cwd: Path,
            env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(best wall seconds, best CPU seconds, last exit code) over `runs` fresh processes."""
    best, best_cpu, code = float("inf"), float("inf"), 0
    for _ in range(runs):
        cpu_before = _children_cpu()
        started = time.perf_counter()
        done = subprocess.run(command, check=False, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        best = min(best, time.perf_counter() - started)
        best_cpu = min(best_cpu, _children_cpu() - cpu_before)
        code = done.returncode
    return best, best_cpu, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--bytecode-cache", action="store_true",
                        help="let the timed processes cache bytecode even if PYTHONDONTWRITEBYTECODE is set")
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
        env = None
        if args.bytecode_cache:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
        rows = []
        for label, files in (("1 file", names[:1]), (f"{args.files} files", names)):
            ours, ours_cpu, code = best_of(args.runs, lint + files, folder, env)
            if code != 0:
                print(f"loopdsl lint exited {code} on the benchmark loop: it should be clean", file=sys.stderr)
                return 1
            theirs = theirs_cpu = None
            if checker:
                theirs, theirs_cpu, _ = best_of(args.runs, [checker, "--schemafile", str(SCHEMA), *files],
                                                folder, env)
            rows.append((label, ours, theirs, ours_cpu, theirs_cpu))
    lines = (LOOP.count("\n"))
    print(f"cold runs, best of {args.runs}; loop file of {lines} lines")
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not args.bytecode_cache:
        print("note: PYTHONDONTWRITEBYTECODE is set, so each loopdsl run compiles its own modules "
              "(check-jsonschema's come precompiled); --bytecode-cache times an installed tool")
    print(f"{'files':>10} | {'loopdsl lint':>12} | {'check-jsonschema':>16} | ratio "
          f"| {'CPU: lint':>9} | {'c-jsonschema':>12} | ratio")
    for label, ours, theirs, ours_cpu, theirs_cpu in rows:
        other = f"{theirs:14.3f} s" if theirs is not None else "  (not installed)"
        ratio = f"{ours / theirs:5.2f}" if theirs else "    -"
        other_cpu = f"{theirs_cpu:10.3f} s" if theirs_cpu is not None else "           -"
        ratio_cpu = f"{ours_cpu / theirs_cpu:.2f}" if theirs_cpu else "-"
        print(f"{label:>10} | {ours:10.3f} s | {other} | {ratio} | {ours_cpu:7.3f} s "
              f"| {other_cpu} | {ratio_cpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
