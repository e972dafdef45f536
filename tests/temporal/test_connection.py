"""Connection options of every `--temporal` command: the address from LOOPDSL_TEMPORAL,
TLS files checked before any network call, and a Temporal Cloud API key that is read from
the environment only and never printed nor kept in a run's history."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ports import free_port

from .conftest import Workers, loopdsl

KEY = "tmprl-key-7f3a9c1e5d"  # a fake API key: found anywhere in output or history, it leaked
LOOP = """\
loopdsl: 1
name: envdump
start: dump
states:
  dump:
    shell: "env | sort"
    next: done
  done: {end: completed}
"""


def _unreachable() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("args, said", [
    (["--tls-cert", "missing.pem", "--tls-key", "missing.key"], "--tls-cert missing.pem: no such file"),
    (["--tls-cert", "cert.pem"], "--tls-cert and --tls-key go together"),
    (["--tls-ca", "notpem.txt"], "--tls-ca notpem.txt: not a PEM file"),
    (["--no-tls", "--tls-ca", "cert.pem"], "--no-tls with a TLS certificate option"),
])
def test_bad_tls_options_are_usage_errors_before_any_connection(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "cert.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (tmp_path / "notpem.txt").write_text("just text\n")
    for command in (["runs"], ["show", "some-run"], ["approve", "some-run"], ["abort", "some-run"]):
        out = loopdsl(*command, "--temporal", _unreachable(), *args, cwd=tmp_path, timeout=60)
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        assert said in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("args", [["--sticky-timeout", "-5"], ["--sticky-timeout", "nan"], ["--sticky-timeout", "1e30"],
                                  ["--grace", "inf"], ["--grace", "-1"], ["--grace", "nan"]])
def test_a_workers_seconds_out_of_range_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    """Checked before connecting (each failed inside the SDK as an internal error, exit 3)."""
    out = loopdsl("worker", "--temporal", _unreachable(), *args, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"Invalid value for '{args[0]}'" in out.stderr and "is not a number of seconds from" in out.stderr
    assert "cannot reach" not in out.stderr


def test_a_tls_file_from_the_environment_is_named_by_its_variable(tmp_path: Path) -> None:
    out = loopdsl("runs", cwd=tmp_path, timeout=60, LOOPDSL_TEMPORAL=_unreachable(),
                  LOOPDSL_TEMPORAL_TLS_CA="gone.pem")
    assert out.returncode == 2 and "LOOPDSL_TEMPORAL_TLS_CA=gone.pem: no such file" in out.stderr, out.stderr


def test_tls_options_without_a_server_are_a_usage_error(tmp_path: Path) -> None:
    out = loopdsl("runs", "--tls-ca", "ca.pem", cwd=tmp_path, timeout=60)
    assert out.returncode == 2 and "--tls-ca without --temporal" in out.stderr, out.stderr


def test_an_unreachable_server_with_an_api_key_never_prints_the_key(tmp_path: Path) -> None:
    out = loopdsl("runs", "--temporal", _unreachable(), cwd=tmp_path, timeout=60, LOOPDSL_TEMPORAL_API_KEY=KEY)
    assert out.returncode == 2, out.stderr
    assert "API key from LOOPDSL_TEMPORAL_API_KEY" in out.stderr and "TLS" in out.stderr
    assert KEY not in out.stdout + out.stderr


async def _history_text(address: str, run_id: str) -> str:
    from temporalio.client import Client

    client = await Client.connect(address)
    history = await client.get_workflow_handle(run_id).fetch_history()
    return json.dumps(history.to_json_dict())


def test_the_address_and_api_key_come_from_the_environment_and_stay_out_of_history(
        tmp_path: Path, workers: Workers) -> None:
    (tmp_path / "envdump.yaml").write_text(LOOP)
    env = {"LOOPDSL_TEMPORAL": workers.address, "LOOPDSL_TEMPORAL_API_KEY": KEY}
    worker = workers.start(tmp_path, extra_args=("--no-tls",), models=False, **env)
    out = loopdsl("run", "envdump.yaml", "--no-tls", "--task-queue", workers.queue, "--json", "--quiet",
                  cwd=tmp_path, **env)
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout.splitlines()[-1])["run_id"]
    shown = loopdsl("show", run_id, "--no-tls", "--json", cwd=tmp_path, **env)
    listed = loopdsl("runs", "--no-tls", cwd=tmp_path, **env)
    assert shown.returncode == 0 and listed.returncode == 0 and run_id in listed.stdout, shown.stderr + listed.stderr
    assert "PATH=" in shown.stdout  # the command's environment is in the run ...
    history = asyncio.run(_history_text(workers.address, run_id))
    for text in (out.stdout, out.stderr, shown.stdout, listed.stdout, history):
        assert KEY not in text  # ... but not the key that authenticated the worker and the CLI
    workers.stop_all()
    assert KEY not in worker.err_text()


def test_what_the_server_refuses_and_bad_settings_are_clear_errors(tmp_path: Path, workers: Workers) -> None:
    """A namespace the server lacks, a task queue name over its limit, a port out of range and
    a heartbeat that is not a number were internal errors (exit 3), some after the run started;
    a NaN heartbeat left a started run failing every workflow task for good."""
    (tmp_path / "loop.yaml").write_text(LOOP)
    for args, said, code in (
        (["runs", "--temporal", workers.address, "--namespace", "no-such-namespace"], "the Temporal server refused", 2),
        (["run", "loop.yaml", "--temporal", workers.address, "--task-queue", "q" * 2000],
         "the Temporal server refused", 2),
        (["runs", "--temporal", "127.0.0.1:99999"], "cannot reach the Temporal server", 2),
    ):
        out = loopdsl(*args, cwd=tmp_path, timeout=60)
        assert out.returncode == code and said in out.stderr and "internal error" not in out.stderr, out.stderr
    for value in ("nan", "-5", "abc"):
        out = loopdsl("run", "loop.yaml", "--temporal", workers.address, "--task-queue", workers.queue, cwd=tmp_path,
                      timeout=60, LOOPDSL_TEMPORAL_HEARTBEAT_S=value)
        assert out.returncode == 2 and "LOOPDSL_TEMPORAL_HEARTBEAT_S" in out.stderr and "started" not in out.stderr, out.stderr
