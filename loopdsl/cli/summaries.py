"""The one-line summary of each command, for `loopdsl --help`: listing them from here
lets help start without importing every command's module (and the engine, the store, the
project tools with them). Each is its command's docstring's first paragraph, whitespace
collapsed; tests/cli/test_command_layout.py keeps the two the same."""
from __future__ import annotations

SUMMARIES = {
    "abort": "End RUN_ID as aborted (its worktree, if any, is kept).",
    "approve": "Approve the checkpoint RUN_ID is waiting at.",
    "audit": "Score each loop under DIRECTORY for readiness (rubric: docs/audit.md).",
    "clean": "Remove worktrees left by runs that did not complete (their branches stay).",
    "cost": "Worst-case and typical cost of one run of LOOP (or of a bundled --pattern), and per month"
            " (definitions: docs/cost.md).",
    "decide": "Record CHOICE (one of the checkpoint's `choices`) for RUN_ID.",
    "github-apply": "The write job: push OUT_DIR's run branches, make the runs' planned `publish:` writes,"
                    " save the run store on loopdsl-runs, post a waiting run's checkpoint.",
    "github-event": "Act on the GitHub event of this job: run LOOP, decide a waiting run, or ignore it.",
    "github-store": "Keep a loop's run store on the loopdsl-runs branch between workflow runs.",
    "graph": "Print LOOP's state machine as Mermaid stateDiagram-v2 (or Graphviz dot).",
    "init": "Scaffold a loop project in DIRECTORY from a bundled pattern: loop, skill, replies, test, hooks.",
    "lint": "Check loop files (and directories of them) for mistakes.",
    "lock": "Pin every file the loops under PATHS depend on (default: loops/) in loopdsl.lock.",
    "patterns": "List loops shipped by installed packages (entry point group loopdsl.loops).",
    "reject": "Reject the checkpoint RUN_ID is waiting at.",
    "resume": "Continue RUN_ID from its last committed state (after a crash or a decision).",
    "run": "Run LOOP (a file, or pkg:NAME from an installed loop package).",
    "runs": "List the runs in the store, newest first.",
    "schedule": "The next run times of LOOP (schedule.cron in schedule.timezone), or a scheduler export.",
    "show": "Show a run: path, per-state results, gates, usage and cost, files.",
    "test": "Run loop tests (*.test.yaml) under PATHS (default: the current folder), offline.",
    "ui": "Browse runs and decide waiting ones in a local web page.",
    "validate": "Same as `lint --strict`: warnings fail too (for users of the older tool; `--strict` is accepted).",
    "worker": "Run loops from Temporal in this repository (loop files, commands and worktrees are here).",
}
