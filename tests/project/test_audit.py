"""`loopdsl audit`: readiness scores from the published rubric, judged from the loop model."""
from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

import loopdsl
from loopdsl.cli import cli
from loopdsl.lint.pipeline import LintSession, load_loop
from loopdsl.project import audit_checks
from loopdsl.project.audit import audit_project
from loopdsl.project.init import scaffold
from loopdsl.project.install_source import from_spec
from loopdsl.project.rubric import RUBRIC, RULES

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parents[1] / "data" / "project"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_rubric_weights_sum_to_100_and_match_the_published_table() -> None:
    assert sum(r.weight for r in RUBRIC) == 100
    doc = (ROOT / "docs" / "audit.md").read_text()
    table = dict(re.findall(r"^\| `([a-z-]+)` \| (\d+) \|", doc, re.MULTILINE))
    assert table == {r.id: str(r.weight) for r in RUBRIC}


@pytest.fixture(scope="module")
def weak_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict]:
    store = tmp_path_factory.mktemp("empty-store")
    weak = DATA / "weak"
    code, text, _ = invoke("audit", str(weak), "--suggest", "--store", str(store))
    _, as_json, _ = invoke("audit", str(weak), "--format", "json", "--store", str(store))
    return code, text, json.loads(as_json)


EXPECTED_LOSSES = {
    # rule id -> (a phrase of the finding, a phrase of its fix)
    "budget-caps": ("budget has no `cost_usd`", "add `cost_usd: 0.25` to `budget:`"),
    "gated-model-calls": ("model call in draft is needed: it is the start state", "gates: {before: [...]}"),
    "separate-evaluator": ('evaluator "review" judges "draft" with the same model', "different temperature"),
    "guarded-side-effects": ("publish acts outside the run's workspace (git push, HTTP write)", "`checkpoint:` state"),
    "declared-secrets": ("publish reads $DEPLOY_TOKEN", "add DEPLOY_TOKEN to `secrets:`"),
    "complete-skills": ("lacks the sections READ, JUDGE, STOP", "WHEN, READ, JUDGE, OUTPUT and STOP"),
    "schedule-set": ("the loop has no `schedule`", 'schedule: {cron:'),
    "tests-pass": ("test weak fails", "loopdsl test"),
    "lint-clean": ("[evaluator-mirrors-generator]", "different model"),
    "recent-runs": ("the loop has never run here", "export that to a scheduler"),
}


def test_weak_loop_loses_every_point_with_rule_id_and_fix(weak_report: tuple[int, str, dict]) -> None:
    code, text, data = weak_report
    assert code == 0  # no --threshold: the score is reported, not enforced
    (loop,) = data["loops"]
    # Its draft <-> review cycle calls a model under a token cap: lint (whose meaning the audit
    # takes) counts that as bounded, so bounded-cycles is the one check it passes.
    assert loop["score"] == RULES["bounded-cycles"].weight
    lost = {c["rule"]: c["findings"] for c in loop["checks"] if not c["passed"]}
    assert set(lost) == set(EXPECTED_LOSSES) == set(RULES) - {"bounded-cycles"}
    for rule, (message, fix) in EXPECTED_LOSSES.items():
        assert any(message in f["message"] and fix in f["fix"] and f["rule"] == rule for f in lost[rule]), (rule, lost[rule])
        # The text report names each lost point by its rule id, with its fix under --suggest.
        assert re.search(rf"\[{rule}\] .*{re.escape(message)}", text), rule
    assert text.count("fix: ") == sum(len(f) for f in lost.values())
    assert text.strip().splitlines()[-1] == "project: 15/100 (1 loop)"


def test_threshold_sets_the_exit_code(tmp_path: Path) -> None:
    store = tmp_path / "store"
    # The weak loop scores 15.
    assert invoke("audit", str(DATA / "weak"), "--threshold", "16", "--store", str(store))[0] == 1
    assert invoke("audit", str(DATA / "weak"), "--threshold", "15", "--store", str(store))[0] == 0


def test_a_store_that_cannot_be_read_is_said_not_taken_for_no_runs(tmp_path: Path) -> None:
    """A folder that is not a run store was reported as "the loop has never run here" (exit 0)."""
    other = tmp_path / "not-a-store"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    code, _, err = invoke("audit", str(DATA / "weak"), "--store", str(other))
    assert code == 2 and "is not a loopdsl run store" in err, err


def test_strong_loop_scores_95_then_100_after_a_recent_completed_run(tmp_path: Path) -> None:
    project = tmp_path / "strong"
    shutil.copytree(DATA / "strong", project)
    store = tmp_path / "store"
    before = audit_project(project, store=store)
    (loop,) = before.loops
    assert loop.score == 95, [(c.rule, [f.message for f in c.findings]) for c in loop.checks if not c.passed]
    assert [c.rule for c in loop.checks if not c.passed] == ["recent-runs"]

    repo = tmp_path / "repo"
    repo.mkdir()
    import subprocess

    from loopdsl.project.looptest import git_env

    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "start"]):
        subprocess.run(["git", *args], cwd=repo, env=git_env(), check=True)
    (repo / "f.txt").write_text("x\n")
    subprocess.run(["git", "add", "f.txt"], cwd=repo, env=git_env(), check=True)
    subprocess.run(["git", "commit", "-q", "-m", "f"], cwd=repo, env=git_env(), check=True)
    script = tmp_path / "replies.yaml"
    script.write_text("draft: ['f.txt: a file']\nreview: ['{\"verdict\": \"accept\", \"feedback\": \"ok\"}']\n")
    result = loopdsl.run(project / "loops" / "notes.yaml", script=script, store=store, workdir=repo)
    assert result.status == "completed"

    after = audit_project(project, store=store)
    assert after.loops[0].score == 100 and after.score == 100
    # A run older than --days does not count.
    later = datetime(2999, 1, 1, tzinfo=timezone.utc)
    stale = audit_project(project, store=store, now=later, days=7)
    assert stale.loops[0].score == 95


def _loop(tmp_path: Path, text: str) -> object:
    path = tmp_path / "l.yaml"
    path.write_text(text)
    return load_loop(path)


CYCLES = """loopdsl: 1
name: cycles
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 10}
  c: {model: anthropic/claude-haiku-4-5, max_tokens: 10}
budget: BUDGET
start: a
states:
  a:
    llm: {model: m, prompt: "x"}
    MAXA
    next: b
  b:
    evaluate: {model: c, prompt: "{{ a.text }}"}
    transitions:
      - {to: c, when: "b.verdict == 'accept'"}
      - {to: a}
  c:
    evaluate: {model: c, prompt: "{{ a.text }}"}
    MAXC
    transitions:
      - {to: done, when: "c.verdict == 'accept'"}
      - {to: c_retry}
  c_retry:
    set: {n: "1"}
    next: c
  done: {end: completed}
"""


def _linted_ctx(tmp_path: Path, text: str) -> audit_checks.AuditContext:
    """An audit context whose lint findings are lint's own for `text` (the loop may have lint errors)."""
    path = tmp_path / "l.yaml"
    path.write_text(text)
    analysis = LintSession().lint_file(path)
    assert analysis.loop is not None
    return audit_checks.AuditContext(loop=analysis.loop, file=Path("l.yaml"), tree=[analysis.loop], tests=[], runs=[],
                                     store_dir=None, days=7, now=datetime.now(timezone.utc),
                                     lint=analysis.diagnostics, tree_lint=analysis.diagnostics)


def _cycle_findings(tmp_path: Path, budget: str, max_a: str, max_c: str) -> list[str]:
    text = CYCLES.replace("BUDGET", budget).replace("MAXA", max_a).replace("MAXC", max_c)
    return [f.message for f in audit_checks.check_cycles(_linted_ctx(tmp_path, text)).findings]


def test_bounded_cycles_takes_lints_unbounded_cycle_findings(tmp_path: Path) -> None:
    both = _cycle_findings(tmp_path, "{}", "", "")
    assert len(both) == 2 and all(m.endswith("[unbounded-cycle]") for m in both), both
    assert any("a -> b -> a" in m for m in both) and any("c -> c_retry -> c" in m for m in both)
    # Bounding the first cycle leaves the second one open: every cycle needs its own bound.
    only_first = _cycle_findings(tmp_path, "{}", "max_visits: 3", "")
    assert len(only_first) == 1 and "c -> c_retry -> c" in only_first[0]
    assert _cycle_findings(tmp_path, "{}", "max_visits: 3", "max_visits: 2") == []
    # Lint's meaning, not a second one: a wall-time cap bounds every cycle, and a token cap
    # every cycle that calls a model (both of these do).
    assert _cycle_findings(tmp_path, "{wall_time: 1m}", "", "") == []
    assert _cycle_findings(tmp_path, "{tokens: 1000}", "", "") == []


def test_a_loop_with_an_unbounded_cycle_does_not_load_and_says_why(tmp_path: Path) -> None:
    text = CYCLES.replace("BUDGET", "{}").replace("MAXA", "").replace("MAXC", "")
    (tmp_path / "l.yaml").write_text(text)
    (audit,) = audit_project(tmp_path, store=tmp_path / "no-store").loops
    assert audit.score == 0 and audit.load_error and audit.load_error.endswith("[unbounded-cycle]"), audit.load_error


EVALUATORS = """loopdsl: 1
name: evaluators
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 10}
  c: {model: anthropic/claude-haiku-4-5, max_tokens: 10}
budget: {steps: 9}
start: first
states:
  first:
    llm: {model: m, prompt: "x"}
    next: second
  second:
    llm: {model: c, prompt: "y"}
    next: judge
  judge:
    evaluate: {model: m, prompt: "PROMPT"}
    next: done
  done: {end: completed}
"""


def test_separate_evaluator_judges_the_generators_lint_says_it_judges(tmp_path: Path) -> None:
    def findings(prompt: str) -> list[str]:
        ctx = _linted_ctx(tmp_path, EVALUATORS.replace("PROMPT", prompt))
        return [f.message for f in audit_checks.check_evaluator(ctx).findings]

    # Naming no generator, the evaluator judges the llm state that runs just before it
    # (`second`, another model), not every llm state of the loop.
    assert findings("is it right?") == []
    (found,) = findings("is {{ first.text }} right?")
    assert found.startswith('evaluator "judge" judges "first" with the same model') and found.endswith("[evaluator-mirrors-generator]")


def test_a_checkpoint_on_every_path_guards_an_external_effect(tmp_path: Path) -> None:
    base = """loopdsl: 1
name: fx
budget: {steps: 5, wall_time: 1m}
start: decide
states:
  decide:
    set: {go: "true"}
    transitions:
      - {to: ask, when: "decide.go"}
      - {to: push}
  ask:
    checkpoint: {message: "push?"}
    transitions:
      - {to: push, when: "ask.decision == 'approve'"}
      - {to: done}
  push:
    shell: git push origin HEAD
    next: done
  done: {end: completed}
"""
    loop = _loop(tmp_path, base)
    ctx = audit_checks.AuditContext(loop=loop, file=Path("l.yaml"), tree=[loop], tests=[], runs=[], store_dir=None,  # type: ignore[arg-type]
                                    days=7, now=datetime.now(timezone.utc), lint=[])
    findings = audit_checks.check_side_effects(ctx).findings
    assert len(findings) == 1 and "push acts outside" in findings[0].message  # the path decide -> push skips `ask`
    guarded = _loop(tmp_path, base.replace("      - {to: push}\n  ask", "      - {to: done}\n  ask"))
    ctx.loop, ctx.tree = guarded, [guarded]  # type: ignore[assignment]
    assert audit_checks.check_side_effects(ctx).findings == []


PATTERN_NAMES = ["changelog-drafter", "ci-sweeper", "daily-triage", "dependency-sweeper", "issue-triage",
                 "post-merge-cleanup", "pr-babysitter"]


@pytest.mark.parametrize("name", PATTERN_NAMES)
def test_bundled_patterns_audit_at_least_90(name: str, tmp_path: Path) -> None:
    scaffold(tmp_path, name, install=from_spec("loopdsl==0.1.0"))
    report = audit_project(tmp_path, store=tmp_path / "no-store")
    (loop,) = report.loops
    lost = {c.rule: [f.message for f in c.findings] for c in loop.checks if c.applicable and not c.passed}
    # A fresh scaffold has never run; everything else is the loop's own doing.
    assert "tests-pass" not in lost and "lint-clean" not in lost, lost
    assert loop.score >= 90, lost


def _suggested_commands(text: str) -> list[str]:
    return [cmd for line in text.splitlines() if line.strip().startswith("fix:")
            for cmd in re.findall(r"`(loopdsl [^`]+)`", line)]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["parent", "inside"])
def test_every_suggested_command_runs_as_printed_from_where_audit_ran(where: str, tmp_path: Path) -> None:
    import os
    import shlex
    import subprocess
    import sys

    from cli_forked import loopdsl_bin
    from cli_in_process import cli_in_process

    project = tmp_path / "my project"  # a space: the printed paths must be quoted
    shutil.copytree(DATA / "weak", project)
    shutil.copytree(DATA / "strong" / "loops", project / "loops", dirs_exist_ok=True)
    shutil.copytree(DATA / "strong" / "skills", project / "skills", dirs_exist_ok=True)
    (project / "loops" / "broken.yaml").write_text("loopdsl: 1\nname: broken\nstart: nowhere\nstates: {}\n")
    cwd, target = (tmp_path, "my project") if where == "parent" else (project / "loops", "..")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    env["PATH"] = os.pathsep.join([str(loopdsl_bin()), str(Path(sys.executable).parent), env.get("PATH", "")])

    def sh(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "--noprofile", "--norc", "-c", command], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300, check=False)

    def printed(command: str) -> subprocess.CompletedProcess[str]:
        """From the parent folder, as bash runs it; from inside, split by the shell's quoting rules
        (shlex) and run in-process (tests/cli_in_process.py), which spares a Python start each."""
        if where == "parent":
            return sh(command)
        program, *args = shlex.split(command)
        assert program == "loopdsl", command
        return cli_in_process(args, cwd, env, only_env=True)

    audited = sh(f"loopdsl audit '{target}' --suggest --store '{tmp_path / 'no-store'}'")
    assert audited.returncode == 0, audited.stderr
    commands = _suggested_commands(audited.stdout)
    assert {c.split()[1] for c in commands} >= {"cost", "test", "lint", "schedule"}, audited.stdout
    for command in commands:
        done = printed(command)
        # 0 or 1 (the command found what the audit found); never 2, a command that cannot run as printed.
        assert done.returncode in (0, 1), f"{command!r} in {cwd}: exit {done.returncode}\n{done.stderr}"
        assert "Traceback" not in done.stderr and "cannot read" not in done.stderr, command


def test_lint_findings_of_a_sub_loop_count_for_its_parent(tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "judge.yaml").write_text(EVALUATORS.replace("PROMPT", "is {{ first.text }} right?"))
    (tmp_path / "parent.yaml").write_text(
        "loopdsl: 1\nname: parent\nbudget: {steps: 20}\nstart: child\nstates:\n"
        "  child:\n    loop: parts/judge.yaml\n    next: done\n  done: {end: completed}\n")
    report = audit_project(tmp_path, store=tmp_path / "no-store")
    (audit,) = report.loops
    assert audit.name == "parent" and report.parts == [(tmp_path / "parts" / "judge.yaml").resolve()]
    (check,) = [c for c in audit.checks if c.rule == "separate-evaluator"]
    assert check.applicable and [f.where.split(":")[0] for f in check.findings] == ["judge.yaml"], check
