"""A new user's first runs: no LiteLLM where no model is called, a missing key stopped before
anything runs, an `auth` error never retried, LiteLLM's import never charged to a run.

Every command runs in a real subprocess (`python -m loopdsl`), with this checkout first on
the path; model calls go over real HTTP to the loopback stub.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_in_process import cli_in_process
from stub_server import StubServer

import loopdsl
from cli_forked import loopdsl_command

# The scaffolded project once (tests/conftest.py), in the group of the tests that import LiteLLM
# in-process: one import a run (CONTRIBUTING.md)
pytestmark = pytest.mark.xdist_group("litellm")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "deterministic-multistep"
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.invalid",
                "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
# Runs the CLI, then reports on stderr whether anything imported LiteLLM (whatever the exit),
# and whether the process froze its objects out of the collector's reach (it does after LiteLLM).
REPORTING_CLI = textwrap.dedent("""\
    import atexit, gc, sys
    atexit.register(lambda: sys.stderr.write("\\nLITELLM-IMPORTED=%s FROZEN=%s\\n" % (
        any(m.split(".")[0] == "litellm" for m in list(sys.modules)), gc.get_freeze_count() > 0)))
    from loopdsl.cli import main
    sys.argv = ["loopdsl", *sys.argv[1:]]
    main()
""")
# The same, on a machine where `import litellm` is slow: its module takes 5 s more to run. (Only
# that module's import waits, as on a loaded machine; other imports go on meanwhile.)
SLOW_IMPORT_CLI = textwrap.dedent("""\
    import importlib.machinery, sys, time
    class SlowLoader:
        def __init__(self, real):
            self.real = real
        def __getattr__(self, name):
            return getattr(self.real, name)
        def create_module(self, spec):
            return self.real.create_module(spec)
        def exec_module(self, module):
            time.sleep(5)
            self.real.exec_module(module)
    class SlowLiteLLM:
        def find_spec(self, name, path=None, target=None):
            if name != "litellm":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            spec.loader = SlowLoader(spec.loader)
            return spec
    sys.meta_path.insert(0, SlowLiteLLM())
    from loopdsl.cli import main
    sys.argv = ["loopdsl", *sys.argv[1:]]
    main()
""")


def bare_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with no credentials at all: what a new user's shell has."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(ROOT),
            "LANG": "C.UTF-8", **extra}


def cli(code: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`loopdsl init --pattern daily-triage`, committed to a fresh git repository."""
    base = tmp_path_factory.mktemp("first-use")
    env = bare_env(base, **GIT_IDENTITY)
    subprocess.run([*loopdsl_command(), "init", "proj", "--pattern", "daily-triage", "--pip-spec", "loopdsl==0.1.0"], cwd=base,
                   env=env, check=True, capture_output=True, timeout=120)
    project = base / "proj"
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "scaffold"]):
        subprocess.run(command, cwd=project, env=env, check=True, timeout=60)
    return project


# -- LiteLLM only where a model is really called ------------------------------------------------
@pytest.mark.parametrize("command", [
    ["test", "loops/"],
    ["audit"],
    ["cost", "loops/daily-triage.yaml"],
    ["run", str(EXAMPLE / "loop.yaml"), "--script", str(EXAMPLE / "replies.yaml"), "--no-store", "--quiet"],
], ids=["test", "audit", "cost", "scripted-run"])
def test_commands_that_call_no_model_never_import_litellm(scaffold: Path, tmp_path: Path, command: list[str]) -> None:
    cwd = scaffold
    if command[0] == "run":
        cwd = tmp_path  # the example writes its scripts into the working directory
    done = cli(REPORTING_CLI, *command, cwd=cwd, env=bare_env(tmp_path))
    assert done.returncode in (0, 1), done.stderr  # audit's exit 1 is a score below its threshold
    assert "LITELLM-IMPORTED=False FROZEN=False" in done.stderr, done.stderr[-2000:]


# -- a missing API key ----------------------------------------------------------------------------
def test_a_missing_key_stops_the_run_before_its_first_state(scaffold: Path, tmp_path: Path) -> None:
    done = cli(REPORTING_CLI, "run", "loops/daily-triage.yaml", cwd=scaffold, env=bare_env(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "OPENAI_API_KEY" in done.stderr and "ANTHROPIC_API_KEY" in done.stderr
    assert "loops/daily-triage.yaml:32:3: model 'writer' (openai/gpt-4o-mini) needs OPENAI_API_KEY" in done.stderr
    assert "hint: set ANTHROPIC_API_KEY, OPENAI_API_KEY" in done.stderr and "--script" in done.stderr
    assert "Traceback" not in done.stderr and "→" not in done.stderr  # no state ran
    assert not (scaffold / ".loopdsl").exists()  # no run recorded, no worktree made
    # LiteLLM was imported to check the keys: the CLI's process then froze its objects.
    assert "LITELLM-IMPORTED=True FROZEN=True" in done.stderr, done.stderr[-2000:]


@pytest.mark.slow
def test_api_key_env_and_fallbacks_are_checked_too(tmp_path: Path) -> None:
    loop = tmp_path / "loop.yaml"
    loop.write_text(textwrap.dedent("""\
        loopdsl: 1
        name: keys
        models:
          main: {model: openai/gpt-4o-mini, api_key_env: MY_TEAM_KEY, max_tokens: 50,
                 fallbacks: [anthropic/claude-haiku-4-5]}
        start: ask
        states:
          ask: {llm: {model: main, prompt: hi}, next: done}
          done: {end: completed}
        """))
    # In-process: the subprocess form of this refusal is the test above; here the point is which
    # keys are named, and a `python -m loopdsl` start (LiteLLM's import included) cost 4 s each.
    done = cli_in_process(["run", str(loop), "--no-store"], tmp_path, bare_env(tmp_path), only_env=True)
    assert done.returncode == 2, done.stderr
    assert f"{loop}:4:3: model 'main' (openai/gpt-4o-mini) needs MY_TEAM_KEY" in done.stderr
    assert f"{loop}:4:3: model 'main' (anthropic/claude-haiku-4-5, a fallback) needs ANTHROPIC_API_KEY" in done.stderr
    # The alias's own key given, the fallback's still missing: still refused, naming only it.
    again = cli_in_process(["run", str(loop), "--no-store"], tmp_path,
                           bare_env(tmp_path, MY_TEAM_KEY="sk-team"), only_env=True)
    assert again.returncode == 2 and "MY_TEAM_KEY" not in again.stderr and "ANTHROPIC_API_KEY" in again.stderr


def stub_loop(tmp_path: Path, stub: StubServer, *, retry: str, extra: str = "") -> Path:
    path = tmp_path / "loop.yaml"
    path.write_text(textwrap.dedent(f"""\
        loopdsl: 1
        name: stubbed
        models:
          stub: {{model: openai/stubby, api_base: "{stub.api_base}", max_tokens: 50,
                  price: {{input_per_mtok: 1, output_per_mtok: 2}}}}
        {extra}
        start: warm
        states:
          warm: {{shell: {{argv: ["true"]}}, next: ask}}
          ask:
            llm: {{model: stub, prompt: "Say hi"}}
            retry: {retry}
            timeout: 3s
            next: done
          done: {{end: completed, output: {{said: "{{{{ ask.text }}}}"}}}}
        """))
    return path


# -- an `auth` error is never retried ---------------------------------------------------------------
def test_an_auth_error_is_never_retried_even_when_listed(stub_server: StubServer, tmp_path: Path) -> None:
    for _ in range(3):
        stub_server.reply_status(401, "Incorrect API key provided")
    loop = stub_loop(tmp_path, stub_server, retry="{max_attempts: 3, on: [auth, server_error], backoff: {initial: 0s}}")
    result = loopdsl.run(loop, workdir=tmp_path)
    assert len(stub_server.requests) == 1
    assert result.status == "failed" and result.state.error["kind"] == "auth"
    assert "HTTP 401" in result.state.error["message"]
    assert not [e for e in result.events if e["type"] == "retry"]


# -- LiteLLM's import is never charged to a run -------------------------------------------------------
@pytest.mark.slow
def test_the_import_wait_is_charged_to_neither_the_state_nor_wall_time(stub_server: StubServer, tmp_path: Path) -> None:
    stub_server.reply_text("hi there", prompt_tokens=5, completion_tokens=2)
    # wall_time and the state's timeout (3 s) are both shorter than the (slowed) 5 s import.
    loop = stub_loop(tmp_path, stub_server, retry="{max_attempts: 1}", extra="budget: {wall_time: 3s}")
    done = cli(SLOW_IMPORT_CLI, "run", str(loop), "--no-store", "--json", cwd=tmp_path, env=bare_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["outputs"] == {"said": "hi there"}
    assert summary["usage"]["ask"]["seconds"] < 3.0
    types = [json.loads(line)["type"] for line in done.stdout.strip().splitlines()[:-1]]
    # The shell state ran while LiteLLM was importing; the model state waited for it first.
    assert types.index("loading") > types.index("ok") and types.index("loading") < types.index("llm")
    assert "loading model client..." in done.stderr
    assert len(stub_server.requests) == 1
