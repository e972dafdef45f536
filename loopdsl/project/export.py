"""`loopdsl schedule --export`: a GitHub Actions workflow or a crontab entry for a loop.

The workflow runs the loop on its schedule (converted to UTC, GitHub's only time zone),
passes the loop's declared secrets and the provider keys its models need from
`${{ secrets.NAME }}`, and keeps the run store between workflow runs with actions/cache
(restored first, saved even when the run fails) so a run waiting at a checkpoint can be
decided and resumed by a manual dispatch with `run_id` and `decision`.
"""
from __future__ import annotations

import io
import json
import math
import shlex
import shutil
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, LiteralScalarString

from ..adapters.git_worktree import find_repo_root
from ..language.model import Loop
from ..language.prices import model_provider
from .discover import loop_tree
from .schedule import ScheduleError, require_schedule, to_utc_cron

# LiteLLM reads these environment variables for each provider prefix.
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",), "anthropic": ("ANTHROPIC_API_KEY",), "gemini": ("GEMINI_API_KEY",),
    "groq": ("GROQ_API_KEY",), "mistral": ("MISTRAL_API_KEY",), "cohere": ("COHERE_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",), "openrouter": ("OPENROUTER_API_KEY",), "xai": ("XAI_API_KEY",),
    "together_ai": ("TOGETHERAI_API_KEY",), "fireworks_ai": ("FIREWORKS_AI_API_KEY",),
    "perplexity": ("PERPLEXITYAI_API_KEY",), "azure": ("AZURE_API_KEY", "AZURE_API_BASE", "AZURE_API_VERSION"),
    "bedrock": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION_NAME"),
}
STORE_DIR = ".loopdsl"


class ExportError(ScheduleError):
    pass


def _tree(loop: Loop) -> list[Loop]:
    return loop_tree(loop)


def provider_keys(loop: Loop) -> list[str]:
    """Environment variables the loop's model calls need (in every sub-loop too)."""
    names: list[str] = []
    for member in _tree(loop):
        for alias in member.models.values():
            if alias.api_key_env:
                names.append(alias.api_key_env)
                continue
            if alias.api_base:
                continue  # a local server: no provider key
            for model in (alias.model, *alias.fallbacks):
                prefix = model.split("/", 1)[0] if "/" in model else (model_provider(model) or "")
                names.extend(PROVIDER_KEYS.get(prefix, ()))
    return list(dict.fromkeys(names))


def declared_secrets(loop: Loop) -> list[str]:
    return list(dict.fromkeys(name for member in _tree(loop) for name in member.secrets))


def checkpoints(loop: Loop) -> list[str]:
    return [f"{m.name}.{s.name}" if m is not loop else s.name
            for m in _tree(loop) for s in m.states.values() if s.kind == "checkpoint"]


def yaml_quoted(value: str) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML)."""
    return json.dumps(value)


def _dispatch_inputs() -> dict[str, Any]:
    """The manual run that decides (and resumes) a run waiting at a checkpoint."""
    return {
        "run_id": {"description": "A run waiting at a checkpoint (see the last run's log); empty starts a new run",
                   "required": False, "default": ""},
        "decision": {"description": "The decision for run_id: approve, reject, or one of the checkpoint's choices",
                     "required": False, "default": "approve"},
    }


def _run_script(loop: Loop, loop_path: str, keep_store: bool, worktree: bool) -> str:
    """The bash script of the run step: run (or decide and resume), a wait for a person is no failure."""
    body = []
    if worktree:
        body += ['git config user.name "github-actions[bot]"',
                 'git config user.email "41898282+github-actions[bot]@users.noreply.github.com"']
    body.append("status=0")
    run_cmd = f"loopdsl run {shlex.quote(loop_path)}"
    if keep_store:
        body += [
            'if [ -n "${RUN_ID:-}" ]; then',
            '  loopdsl decide "$RUN_ID" "$DECISION" --comment "workflow_dispatch by $GITHUB_ACTOR"',
            '  loopdsl resume "$RUN_ID" || status=$?',
            "else",
            f"  {run_cmd} || status=$?",
            "fi",
            'if [ "$status" -eq 4 ]; then',
            f'  echo "::notice::{loop.name} waits for a person. Run this workflow by hand with run_id and decision."',
            "  loopdsl runs",
            "  status=0",
            "fi",
        ]
    else:
        body.append(f"{run_cmd} || status=$?")
    body.append('exit "$status"')
    return "\n".join(body) + "\n"


def _steps(loop: Loop, loop_path: str, env_names: list[str], *, keep_store: bool, worktree: bool,
           pip_spec: str, python: str) -> list[dict[str, Any]]:
    store_key = f"loopdsl-store-{loop.name}-"
    steps: list[dict[str, Any]] = [
        {"uses": "actions/checkout@v4", "with": {"fetch-depth": 0}},
        {"uses": "actions/setup-python@v5", "with": {"python-version": DoubleQuotedScalarString(python)}},
        {"name": "Install loopdsl", "run": f"python -m pip install {shlex.quote(pip_spec)}"},
    ]
    if keep_store:
        steps.append({"name": "Restore the run store", "uses": "actions/cache/restore@v4",
                      "with": {"path": STORE_DIR, "key": store_key + "${{ github.run_id }}",
                               "restore-keys": LiteralScalarString(store_key + "\n")}})
    env = {name: f"${{{{ secrets.{name} }}}}" for name in env_names}
    env["LOOPDSL_STORE"] = STORE_DIR
    if keep_store:
        env.update({"RUN_ID": "${{ inputs.run_id }}", "DECISION": "${{ inputs.decision }}"})
    steps.append({"name": f"Run {loop.name}", "env": env,
                  "run": LiteralScalarString(_run_script(loop, loop_path, keep_store, worktree))})
    if keep_store:
        steps.append({"name": "Save the run store", "if": "always()", "uses": "actions/cache/save@v4",
                      "with": {"path": STORE_DIR, "key": store_key + "${{ github.run_id }}"}})
    if worktree:
        steps.append({"name": "Push the runs' branches (loopdsl/<run-id>)", "run": LiteralScalarString(
            "branches=$(git for-each-ref --format='%(refname)' refs/heads/loopdsl/)\n"
            'if [ -n "$branches" ]; then git push origin $branches; fi\n')})
    return steps


def _header(loop: Loop, loop_path: str, cron: str, tz: object, keep_store: bool, warnings: list[str],
            env_names: list[str]) -> list[str]:
    zone_note = "" if str(tz) in ("UTC", "utc") else f" (the loop's {loop.schedule.timezone} schedule {cron!r}, in UTC)"  # type: ignore[union-attr]
    lines = [f"Generated by `loopdsl schedule {loop_path} --export github-actions`.",
             f"Runs the loop {loop.name!r} on its schedule{zone_note}."]
    if keep_store:
        lines.append("The run store (.loopdsl/) is kept between runs; to decide a run waiting at a checkpoint,"
                     " run this workflow by hand with run_id and decision.")
    lines += [f"WARNING: {w}" for w in warnings]
    if env_names:
        lines.append(f"Repository secrets to create (Settings > Secrets and variables > Actions): {', '.join(env_names)}")
    # A comment line ends at a line break: one inside a value must not start uncommented YAML.
    return [" ".join(line.splitlines()) for line in lines]


def github_actions(loop: Loop, loop_path: str, *, keep_store: bool = True, pip_spec: str = "loopdsl",
                   python: str = "3.11") -> tuple[str, list[str]]:
    """(workflow YAML, warnings): the workflow is built as a mapping and written by ruamel.yaml,
    which quotes every value that needs it."""
    cron, tz = require_schedule(loop)
    waiting = checkpoints(loop)
    if not keep_store and not loop.unattended:
        what = f"it has checkpoint(s) {', '.join(waiting)}" if waiting else "it is not marked `unattended: true`"
        raise ExportError(
            f"refusing to export {loop.name} without a kept run store: {what}. A run that waits for a person "
            "stops with its state in the run store; a fresh CI machine would lose it, and the decision could never be resumed",
            "export without --no-store-cache (the workflow keeps .loopdsl/ with actions/cache), "
            "or remove the checkpoints and declare `unattended: true`")
    utc = to_utc_cron(cron, tz)
    warnings = list(utc.notes)
    env_names = list(dict.fromkeys(declared_secrets(loop) + provider_keys(loop)))
    wall = loop.budget.wall_time
    worktree = any(m.workspace.worktree for m in _tree(loop))
    dispatch = {"inputs": _dispatch_inputs()} if keep_store else None
    workflow = CommentedMap({
        "name": f"loopdsl: {loop.name}",
        "on": {"schedule": [{"cron": utc.cron}], "workflow_dispatch": dispatch},
        "permissions": {"contents": "write" if worktree else "read"},
        "concurrency": {"group": f"loopdsl-{loop.name}", "cancel-in-progress": False},
        "jobs": {"run": {"runs-on": "ubuntu-latest",
                         "timeout-minutes": int(math.ceil(wall / 60)) + 15 if wall else 60,
                         "steps": _steps(loop, loop_path, env_names, keep_store=keep_store, worktree=worktree,
                                         pip_spec=pip_spec, python=python)}},
    })
    workflow.yaml_set_start_comment("\n".join(_header(loop, loop_path, cron, tz, keep_store, warnings, env_names)))
    yaml = YAML()
    yaml.width = 4096  # long commands and descriptions stay on one line
    yaml.indent(mapping=2, sequence=4, offset=2)
    out = io.StringIO()
    yaml.dump(workflow, out)
    return out.getvalue(), warnings


def crontab(loop: Loop, loop_path: str, project_dir: Path) -> tuple[str, list[str]]:
    """(crontab lines, warnings). CRON_TZ picks the schedule's zone (cronie, systemd-cron);
    TZ sets it for the command too."""
    cron, tz = require_schedule(loop)
    exe = shutil.which("loopdsl") or "loopdsl"
    zone_name = loop.schedule.timezone  # type: ignore[union-attr]
    needs = list(dict.fromkeys(declared_secrets(loop) + provider_keys(loop)))
    log = f"{STORE_DIR}/{loop.name}.cron.log"
    command = (f"cd {shlex.quote(str(project_dir))} && mkdir -p {STORE_DIR} && "
               f"{shlex.quote(exe)} run {shlex.quote(loop_path)} --quiet >> {shlex.quote(log)} 2>&1")
    lines = [f"# loopdsl: {loop.name} ({loop_path}); generated by `loopdsl schedule {loop_path} --export crontab`",
             "# CRON_TZ and TZ apply to every line after them in this crontab."]
    if needs:
        lines.append(f"# cron does not read your shell profile: put {', '.join(needs)} in this crontab's environment"
                     " (NAME=value lines) or in a file the command sources.")
    lines += [f"CRON_TZ={zone_name}", f"TZ={zone_name}", f"{cron} {command}"]
    warnings = [] if zone_name in ("UTC", "Etc/UTC") else [
        f"CRON_TZ is honoured by cronie and systemd-cron; other cron daemons run the line in the system zone: "
        f"check `{cron}` means {zone_name} time on your machine"]
    return "\n".join(lines) + "\n", warnings


def project_relative(loop_file: Path) -> tuple[str, Path]:
    """The loop's path relative to its repository root (or the current folder), and that root."""
    file = loop_file.resolve()
    root = find_repo_root(file.parent) or Path.cwd().resolve()
    try:
        return file.relative_to(root).as_posix(), root
    except ValueError:
        return str(file), root


