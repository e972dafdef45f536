"""`loopdsl github-event`, `github-store` and `github-apply`: the steps of the exported
GitHub Actions workflow (docs/github.md). They read the standard Actions variables
(GITHUB_EVENT_NAME, GITHUB_EVENT_PATH, GITHUB_REPOSITORY, GITHUB_API_URL) and GITHUB_TOKEN."""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click

from ..adapters.git_worktree import find_repo_root
from ..adapters.terminal import Progress, summary
from ..language.terminal_safe import visible
from ..api import runs as api
from ..api.durable import budget_caps, decide as record_decision, resume_durable
from ..project import github_checkpoints as checkpoints, github_trust, runs_branch, worktree_carry
from ..project.github_event import GitHubEventError, Plan, plan, read_event
from ..runtime.errors import StoreError
from ..runtime.run_keys import default_store_dir
from .output import EXIT_OK, made_folder, script_option, store_option

_OK_STATUSES = ("completed", "waiting")


def _repo() -> Path:
    root = find_repo_root(Path.cwd())
    if root is None:
        raise GitHubEventError("not inside a git repository", "run it in the workflow's checkout")
    return root


def _store_dir(store: str | None) -> Path:
    return Path(store) if store else default_store_dir(Path.cwd())


def _notice(text: str) -> None:
    click.echo(visible(f"::notice::{text}"))


@click.command("github-event")
@click.argument("loop")
@script_option
@store_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Folder for the apply job (checkpoint.json).")
def github_event(loop: str, script: str | None, store: str | None, out_dir: str | None) -> None:
    """Act on the GitHub event of this job: run LOOP, decide a waiting run, or ignore it."""
    model = api.resolve_loop(loop)
    out = made_folder(out_dir, "--out") if out_dir else None  # before the run: its checkpoint goes there
    name, payload = read_event()
    todo = plan(model, name, payload)
    if todo.action == "ignore":
        _notice(f"{model.name}: {name} event ignored: {todo.reason}")
        sys.exit(EXIT_OK)
    if todo.actor:
        checkpoints.require_writer(todo.actor)
    listeners = [Progress(budget_caps(model))]
    if todo.action == "run":
        # publish=False: this job's token cannot write; `github-apply` makes the planned writes.
        result = api.run(model, todo.inputs, script=script, store=store or True, listeners=listeners, publish=False)
    else:
        run_id = _decided_run(model.name, todo, store)
        record_decision(run_id, todo.choice, todo.comment, store=store, by=todo.by or None)
        click.echo(visible(f"run {run_id}: recorded '{todo.choice}' by {todo.by}"))
        result = asyncio.run(resume_durable(run_id, store=store, script=script, listeners=listeners, publish=False))
    click.echo(visible(summary(result.state, result.store_dir)), err=True)
    if result.status == "waiting" and out is not None and result.state.waiting:
        checkpoints.write_checkpoint(out, checkpoints.checkpoint_record(
            result.run_id, model.name, result.state.waiting, todo.number))
    sys.exit(EXIT_OK if result.status in _OK_STATUSES else result.exit_code)


def _decided_run(loop_name: str, todo: Plan, store: str | None) -> str:
    """The run a decision is for; exits 0 with a notice when this loop has none to decide."""
    try:
        opened = api.open_store(store, Path.cwd(), create=False)
    except StoreError:
        _notice(f"{loop_name}: no run store here; the decision is for another loop")
        sys.exit(EXIT_OK)
    try:
        if todo.action == "review" and todo.number is not None:
            run_id, why = checkpoints.review_target(opened, loop_name, todo.number, todo.choice)
            if run_id is not None:
                return run_id
            _notice(f"{loop_name}: pull_request_review ignored: {why}")
        else:
            try:
                return opened.resolve(todo.run_ref)
            except StoreError:
                _notice(f"{loop_name}: no run {todo.run_ref} in this loop's store; the decision is for another loop")
    finally:
        opened.close()
    sys.exit(EXIT_OK)


@click.group("github-store")
def github_store() -> None:
    """Keep a loop's run store on the loopdsl-runs branch between workflow runs."""


@github_store.command("restore")
@click.argument("loop")
@store_option
def store_restore(loop: str, store: str | None) -> None:
    """Put LOOP's runs from origin's loopdsl-runs branch into the (empty) run store."""
    model = api.resolve_loop(loop)
    repo, where = _repo(), _store_dir(store)
    count = runs_branch.restore(repo, model.name, where, os.environ.get("GITHUB_TOKEN"))
    click.echo(f"restored {count} file(s) of {model.name}'s run store" if count
               else f"no stored runs of {model.name} on {runs_branch.BRANCH} yet: a fresh store")
    for run_id in worktree_carry.carry_in(repo, where):
        click.echo(f"restored the worktree of waiting run {run_id}")


@github_store.command("pack")
@click.argument("loop")
@click.argument("out_dir", type=click.Path(file_okay=False))
@store_option
@click.option("--no-store", is_flag=True, help="Bundle the runs' branches only (an unattended loop).")
def store_pack(loop: str, out_dir: str, store: str | None, no_store: bool) -> None:
    """Copy the run store and bundle the runs' branches into OUT_DIR for the apply job."""
    api.resolve_loop(loop)  # the same LOOP argument as the other steps, checked alike
    files, branches = checkpoints.pack(_repo(), _store_dir(store), made_folder(out_dir, "OUT_DIR"), not no_store)
    click.echo(f"packed {files} store file(s) and {branches} branch(es) into {out_dir}")


@click.command("github-apply")
@click.argument("loop")
@click.argument("out_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--no-publish", is_flag=True, help="Leave the runs' `publish:` writes due (a rehearsal without GitHub).")
def github_apply(loop: str, out_dir: str, no_publish: bool) -> None:
    """The write job: push OUT_DIR's run branches, make the runs' planned `publish:` writes,
    save the run store on loopdsl-runs, post a waiting run's checkpoint."""
    model = api.resolve_loop(loop)
    repo, out, token = _repo(), Path(out_dir), os.environ.get("GITHUB_TOKEN")
    store = out / checkpoints.STORE_FOLDER
    # Before any write: the artifact comes from a job that ran the repository's code.
    github_trust.verify_artifact(model, out, repo)
    for branch in checkpoints.push_run_branches(repo, out, token):
        click.echo(f"pushed {branch}")
    published, failures = ([], []) if no_publish else checkpoints.publish_pending_runs(store)
    for run_id in published:
        click.echo(f"published run {run_id}")
    if store.is_dir():  # saved after publishing: the store records what was written
        tip = runs_branch.save(repo, model.name, store, token, f"loopdsl: {model.name} run store")
        click.echo(f"saved the run store on {runs_branch.BRANCH} ({tip[:12]})" if tip else "the run store is unchanged")
    click.echo(checkpoints.post_checkpoint(out))
    if failures:
        raise failures[0]
