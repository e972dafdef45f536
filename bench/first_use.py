"""A new user's first commands: how long each takes, beside its target and beside `main`.

    python bench/first_use.py [--runs 3] [--base main]

The four timings of issue 11 (item 4), each a fresh process as a user runs it, best and
median of --runs:
  1. the README example, `python examples/deterministic-multistep/check.py` (target < 1.5 s);
  2. `loopdsl test loops/` in the repository (target < 4 s);
  3. `loopdsl audit` of a fresh `loopdsl init --pattern daily-triage` scaffold (target < 1 s);
  4. `loopdsl run` of a real-provider loop (a 1 s shell state, then a model call to a
     loopback OpenAI-compatible stub, reached through OPENAI_BASE_URL with a dummy key as
     a user's real key would be): the time to its first output line (target: immediate,
     < 0.5 s), and, without a target, to its model reply and to its end.
Each command runs twice over: with this checkout first on PYTHONPATH, and with a copy of
`--base` (default `main`, extracted with `git archive`, so no worktree is touched).
Absolute times move with the machine's load, so both sides are measured in the same rounds;
the CPU time (user + system of the command and everything it waited for) moves much less, and
is printed below the wall times.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # stub_server and the helpers it imports

REAL_LOOP = textwrap.dedent("""\
    loopdsl: 1
    name: first-use-bench
    models:
      writer: {model: openai/gpt-4o-mini, max_tokens: 50}
    start: gather
    states:
      gather: {shell: {argv: [sleep, "1"]}, next: ask}
      ask: {llm: {model: writer, prompt: "Say hi"}, next: done}
      done: {end: completed, output: {said: "{{ ask.text }}"}}
    """)


def extract(ref: str, into: Path) -> Path:
    """A copy of `ref`'s files (git archive), read-only use: no worktree, no checkout."""
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def env_for(tree: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), **extra}


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall(command: list[str], cwd: Path, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `command`."""
    cpu = cpu_of_children()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if done.returncode not in ok:
        raise SystemExit(f"{' '.join(command)} (in {cwd}) exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return seconds, cpu_of_children() - cpu


def real_run(tree: Path, work: Path, api_base: str) -> tuple[float, float, float, float]:
    """(first output line, model reply line, end, CPU seconds) of `loopdsl run` with a real provider."""
    env = env_for(tree, OPENAI_API_KEY="sk-first-use-bench", OPENAI_BASE_URL=api_base)
    command = [sys.executable, "-m", "loopdsl", "run", str(work / "loop.yaml"), "--no-store"]
    cpu = cpu_of_children()
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = reply = None
    for line in proc.stderr:  # progress goes to stderr, one line per event
        now = time.perf_counter() - start
        first = now if first is None else first
        if reply is None and line.lstrip().startswith("llm "):
            reply = now
    code = proc.wait()
    end = time.perf_counter() - start
    if code != 0 or first is None or reply is None:
        raise SystemExit(f"the real-provider run on {tree} exited {code} without a model reply")
    return first, reply, end, cpu_of_children() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base", default="main", help="git ref to compare with (default: main)")
    args = parser.parse_args()
    from stub_server import StubReply, StubServer

    with tempfile.TemporaryDirectory() as tmp, StubServer() as stub:
        scratch = Path(tmp)
        trees = {"this tree": ROOT, args.base: extract(args.base, (scratch / "base").resolve())}
        work: dict[str, Path] = {}
        for label, tree in trees.items():
            folder = scratch / f"work-{len(work)}"
            folder.mkdir()
            (folder / "loop.yaml").write_text(REAL_LOOP)
            init = [sys.executable, "-m", "loopdsl", "init", "scaffold", "--pattern", "daily-triage"]
            # A source checkout must say what the scaffold's hooks install; older trees lack the flag.
            made = subprocess.run([*init, "--pip-spec", "loopdsl==0.1.0"], cwd=folder, env=env_for(tree),
                                  capture_output=True, text=True)
            if made.returncode != 0 and "no such option" in made.stderr.lower():
                made = subprocess.run(init, cwd=folder, env=env_for(tree), capture_output=True, text=True)
            made.check_returncode()
            work[label] = folder
        stub.enqueue(*[StubReply(text="hi", prompt_tokens=9, completion_tokens=2) for _ in range(2 * args.runs)])
        measures: dict[str, Callable[[str, Path], tuple[float, ...]]] = {
            "check.py": lambda label, tree: wall([sys.executable, "examples/deterministic-multistep/check.py"],
                                                 tree, env_for(tree)),
            "test": lambda label, tree: wall([sys.executable, "-m", "loopdsl", "test", "loops/"], tree, env_for(tree)),
            "audit": lambda label, tree: wall([sys.executable, "-m", "loopdsl", "audit"], work[label] / "scaffold",
                                              env_for(tree), ok=(0, 1)),
            "run": lambda label, tree: real_run(tree, work[label], stub.api_base),
        }
        results: dict[tuple[str, str], list[tuple[float, ...]]] = {}
        for round_ in range(args.runs):  # interleaved: both sides see the same load
            for name, measure in measures.items():
                for label, tree in trees.items():
                    results.setdefault((name, label), []).append(measure(label, tree))
            print(f"round {round_ + 1}/{args.runs} done", file=sys.stderr, flush=True)
        report(results, list(trees), args.runs)
    return 0


ROWS = [  # (label, measure, index in its tuple, target seconds or None)
    ("README example (check.py), wall", "check.py", 0, 1.5),
    ("loopdsl test loops/, wall", "test", 0, 4.0),
    ("loopdsl audit of an init scaffold, wall", "audit", 0, 1.0),
    ("loopdsl run, real provider: first output line", "run", 0, 0.5),
    ("  ... its model reply (1 s shell state first)", "run", 1, None),
    ("  ... its end", "run", 2, None),
    ("README example (check.py), CPU", "check.py", 1, None),
    ("loopdsl test loops/, CPU", "test", 1, None),
    ("loopdsl audit of an init scaffold, CPU", "audit", 1, None),
    ("loopdsl run, real provider, CPU", "run", 3, None),
]


def report(results: dict[tuple[str, str], list[tuple[float, ...]]], labels: list[str], runs: int) -> None:
    ours, base = labels
    print(f"best (median) of {runs} fresh processes; load average {os.getloadavg()[0]:.2f}")
    print(f"{'timing':<48} {'target':>9} {ours:>18} {base:>18}  verdict")
    for title, name, index, target in ROWS:
        cells = []
        for label in (ours, base):
            values = [r[index] for r in results[(name, label)]]
            cells.append((min(values), statistics.median(values)))
        shown = [f"{best:.2f} s ({median:.2f})" for best, median in cells]
        goal = f"< {target:g} s" if target is not None else "-"
        verdict = "" if target is None else ("met" if cells[0][0] < target else "MISSED")
        print(f"{title:<48} {goal:>9} {shown[0]:>18} {shown[1]:>18}  {verdict}")


if __name__ == "__main__":
    sys.exit(main())
