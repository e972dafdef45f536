"""Coding-agent CLIs run for real as subprocesses: fake `claude` and `codex` executables
(tests/data/fake_cli) print the documented event streams for the scenario named on the
prompt's first line, and the adapter is checked on what it charged, killed and returned."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopdsl.adapters.coding_cli import CliSpec, TokenPrices, build_argv, cli_cap_usd, run_coding_cli
from loopdsl.runtime.process_tree import CommandRef
from loopdsl.runtime.redaction import Redactor

FAKES = Path(__file__).resolve().parents[1] / "data" / "fake_cli"
CLAUDE_PRICES = TokenPrices(input_per_mtok=3.0, output_per_mtok=15.0, cache_read_per_mtok=0.3,
                            cache_write_per_mtok=3.75)
CODEX_PRICES = TokenPrices(input_per_mtok=1.25, output_per_mtok=10.0, cache_read_per_mtok=0.125,
                           cache_write_per_mtok=1.25)
API_KEY = "sk-ant-test-KEY-0123456789"
OTHER_SECRET = "ghp_other_secret_value_42"


class Ledger:
    """Stands in for the run's budget: records each charge, refuses once the reservation is reached."""

    def __init__(self, reservation: float) -> None:
        self.reservation = reservation
        self.charges: list[float] = []

    @property
    def total(self) -> float:
        return sum(self.charges)

    def charge(self, delta: float) -> bool:
        self.charges.append(delta)
        return self.total < self.reservation


def _base_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in ("PATH", "LANG", "TERM", "TMPDIR") if k in os.environ}
    env["GITHUB_TOKEN"] = OTHER_SECRET  # in the caller's environment, never the CLI's
    return env


STARTED: list[CommandRef] = []


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    """A failing test must not leave a fake CLI running on the machine."""
    yield
    while STARTED:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(STARTED.pop().pgid, signal.SIGKILL)


def _started(refs: list[CommandRef]) -> Callable[[CommandRef], None]:
    def record(ref: CommandRef) -> None:
        refs.append(ref)
        STARTED.append(ref)
    return record


def _run(kind: str, scenario: str, tmp_path: Path, *, reservation: float = 1.0, worst: float = 0.1,
         timeout: float = 30.0, **spec_fields: Any) -> tuple[Any, Ledger, list[dict], list[CommandRef]]:
    binary = str(FAKES / ("claude" if kind == "claude-code" else "codex"))
    spec = CliSpec(kind=kind, binary=binary, **spec_fields)
    ledger, events, refs = Ledger(reservation), [], []
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    result = asyncio.run(run_coding_cli(
        spec, prompt=f"scenario {scenario}\nDo the task. {OTHER_SECRET}", workspace=workspace,
        reservation_usd=reservation, worst_call_usd=worst,
        prices=CLAUDE_PRICES if kind == "claude-code" else CODEX_PRICES,
        redactor=Redactor([OTHER_SECRET]), base_env=_base_env(), api_key=API_KEY, timeout=timeout,
        charge=ledger.charge, on_event=events.append, on_start=_started(refs), kill_grace=0.3))
    return result, ledger, events, refs


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie not yet reaped by init is gone for our purposes
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _group_gone(pgid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if _gone(pgid) and all(_gone(int(p)) for p in os.listdir("/proc") if p.isdigit()
                               and _pgrp(int(p)) == pgid):
            return True
        time.sleep(0.05)
    return False


def _pgrp(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def _child_pid(events: list[dict]) -> int:
    return next(e["event"]["child_pid"] for e in events if "child_pid" in e["event"])


# ------------------------------------------------------------------ claude


def test_claude_answer_charges_as_events_arrive_and_takes_the_reported_total(tmp_path: Path) -> None:
    result, ledger, events, refs = _run("claude-code", "answer", tmp_path, max_turns=5)
    assert result.stop == "answer" and result.kind is None and result.exit_code == 0
    assert result.text == "All done: fixed a.py."
    # m1 priced (printed twice, charged once), m2 priced, then the reported cumulative total.
    assert ledger.charges == pytest.approx([0.00165, 0.0006, 0.0123 - 0.00225])
    assert result.cost_usd == pytest.approx(0.0123) == pytest.approx(ledger.total)
    assert result.overspend_usd == 0.0
    assert result.usage == {"input_tokens": 150, "output_tokens": 50, "cache_read_tokens": 1000,
                            "cache_write_tokens": 200, "prompt_tokens": 1350, "completion_tokens": 50}
    assert result.turns == 2
    assert [e["event"]["type"] for e in events] == ["system", "assistant", "assistant", "user", "assistant", "result"]
    assert len(refs) == 1 and _group_gone(refs[0].pgid)


def test_claude_flags_environment_and_fresh_home(tmp_path: Path) -> None:
    first, _, _, _ = _run("claude-code", "env", tmp_path, max_turns=7, model="claude-sonnet-4-5",
                          extra_args=("--fake-pinned",), reservation=2.0, worst=0.5)
    report = json.loads(first.text.replace("***", "REDACTED"))
    argv = report["argv"]
    assert argv[0] == "--fake-pinned"  # the alias's extra args come first; ours decide
    for flag, value in (("--output-format", "stream-json"), ("--max-turns", "7"), ("--max-budget-usd", "1.50"),
                        ("--permission-mode", "dontAsk"), ("--tools", "Read,Glob,Grep"),
                        ("--setting-sources", ""), ("--model", "claude-sonnet-4-5")):
        assert argv[argv.index(flag) + 1] == value
    assert {"-p", "--verbose", "--strict-mcp-config"} <= set(argv)
    env = report["env"]
    assert set(env) <= {"PATH", "LANG", "TERM", "TMPDIR", "HOME", "CLAUDE_CONFIG_DIR", "ANTHROPIC_API_KEY",
                        "LOOPDSL_COMMAND_ID"}
    assert "GITHUB_TOKEN" not in env and OTHER_SECRET not in first.text
    assert env["ANTHROPIC_API_KEY"] == "REDACTED"  # it had the key; the result never shows it
    home = Path(env["HOME"])
    assert home != Path.home() and env["CLAUDE_CONFIG_DIR"].startswith(env["HOME"])
    assert not home.exists()  # removed after the attempt
    assert report["cwd"] == str((tmp_path / "ws").resolve())
    assert report["stdin"].startswith("scenario env\nDo the task. ")
    second, _, _, _ = _run("claude-code", "env", tmp_path, max_turns=7)
    assert json.loads(second.text.replace("***", "R"))["env"]["HOME"] != env["HOME"]


@pytest.mark.parametrize("permissions, mode, tools, denied", [
    ("read", "dontAsk", "Read,Glob,Grep", "Bash,WebFetch,WebSearch,Edit,Write,NotebookEdit"),
    ("edit", "acceptEdits", "Read,Glob,Grep,Edit,Write,NotebookEdit", "Bash,WebFetch,WebSearch"),
    ("full", "bypassPermissions", None, None),
])
def test_claude_permission_flags(permissions: str, mode: str, tools: str | None, denied: str | None) -> None:
    argv = build_argv(CliSpec(kind="claude-code", binary="claude", permissions=permissions, max_turns=3), 1.0)
    assert argv[argv.index("--permission-mode") + 1] == mode
    # Never --allowedTools: an allowed tool runs on any path, outside the workspace too.
    assert "--allowedTools" not in argv
    assert (argv[argv.index("--tools") + 1] if "--tools" in argv else None) == tools
    assert (argv[argv.index("--disallowedTools") + 1] if "--disallowedTools" in argv else None) == denied


def test_claude_that_keeps_spending_is_killed_at_the_reservation(tmp_path: Path) -> None:
    started = time.monotonic()
    result, ledger, events, refs = _run("claude-code", "spend", tmp_path, max_turns=50, reservation=1.0)
    assert time.monotonic() - started < 10
    assert result.kind == "budget_exhausted" and result.stop == "error"
    # $0.30 per message: the fourth crosses $1.00 and the group is killed right then.
    assert ledger.charges[:4] == pytest.approx([0.3, 0.3, 0.3, 0.3])
    assert result.cost_usd == pytest.approx(ledger.total)
    assert result.overspend_usd == pytest.approx(result.cost_usd - 1.0) and result.overspend_usd >= 0.2 - 1e-9
    assert len(ledger.charges) <= 6  # killed at once, not after many more
    assert _group_gone(refs[0].pgid)
    assert _gone(_child_pid(events))


def test_spend_reported_past_the_reservation_is_overspend(tmp_path: Path) -> None:
    result, ledger, _, _ = _run("claude-code", "overshoot", tmp_path, max_turns=3, reservation=1.0)
    assert result.kind == "budget_exhausted" and result.text == "done"
    assert result.cost_usd == pytest.approx(1.7) == pytest.approx(ledger.total)
    assert result.overspend_usd == pytest.approx(0.7)
    capped, _, _, _ = _run("claude-code", "own_cap", tmp_path, max_turns=9, reservation=1.0)
    assert capped.kind == "budget_exhausted" and capped.overspend_usd == 0.0
    assert capped.cost_usd == pytest.approx(0.8)


def test_claude_max_turns_auth_and_other_failures(tmp_path: Path) -> None:
    turns, _, _, _ = _run("claude-code", "max_turns", tmp_path, max_turns=3)
    assert (turns.kind, turns.stop, turns.turns) == ("max_turns", "max_turns", 3)
    assert turns.cost_usd == pytest.approx(0.001)
    auth, ledger, _, _ = _run("claude-code", "auth", tmp_path, max_turns=3)
    assert auth.kind == "auth" and "ANTHROPIC_API_KEY" in auth.error and ledger.charges == []
    failed, _, _, _ = _run("claude-code", "fail", tmp_path, max_turns=3)
    assert failed.kind == "shell_exit" and failed.exit_code == 3 and "something broke" in failed.error
    assert API_KEY not in failed.error + failed.stderr
    missing = asyncio.run(run_coding_cli(
        CliSpec(kind="claude-code", binary=str(tmp_path / "no-such-claude")), prompt="x", workspace=tmp_path,
        reservation_usd=1.0, worst_call_usd=0.1, prices=CLAUDE_PRICES, redactor=Redactor([]), base_env=_base_env(),
        api_key=None, timeout=5, charge=lambda d: True))
    assert missing.kind == "shell_exit" and "not found" in missing.error


def test_hostile_lines_are_skipped(tmp_path: Path) -> None:
    result, ledger, events, _ = _run("claude-code", "garbage", tmp_path, max_turns=3)
    assert result.kind is None and result.text == "Survived the garbage."
    # Only the well-formed usage (1000 in, 100 out) and the valid reported total count.
    assert result.usage == {"input_tokens": 1000, "output_tokens": 100, "cache_read_tokens": 0,
                            "cache_write_tokens": 0, "prompt_tokens": 1000, "completion_tokens": 100}
    assert result.cost_usd == pytest.approx(0.0045) == pytest.approx(ledger.total)
    assert result.extra["skipped_lines"] >= 5
    assert all(len(json.dumps(e)) < 64 * 1024 for e in events)  # the 5 MiB line never reaches the log
    cut = next(e["event"] for e in events if e["event"].get("cut"))
    assert cut["type"] == "user" and "bytes cut" in cut["excerpt"]
    assert API_KEY not in json.dumps(events)


def test_secrets_are_redacted_in_text_and_events(tmp_path: Path) -> None:
    result, _, events, _ = _run("claude-code", "leak", tmp_path, max_turns=3)
    assert API_KEY not in result.text and "***" in result.text
    assert API_KEY not in json.dumps(events)


def test_underreported_cost_is_charged_at_the_token_price(tmp_path: Path) -> None:
    result, ledger, _, _ = _run("claude-code", "underreport", tmp_path, max_turns=3, reservation=5.0)
    assert result.cost_usd == pytest.approx(3.0) == pytest.approx(ledger.total)
    assert result.reported_cost_usd == pytest.approx(0.5)


def test_timeout_kills_a_cli_that_ignores_sigterm(tmp_path: Path) -> None:
    started = time.monotonic()
    result, _, events, refs = _run("claude-code", "stubborn", tmp_path, max_turns=3, timeout=1.0)
    assert result.kind == "timeout" and time.monotonic() - started < 8
    assert _group_gone(refs[0].pgid) and _gone(_child_pid(events))


def test_a_leftover_holding_stdout_does_not_hold_the_run(tmp_path: Path) -> None:
    started = time.monotonic()
    result, _, events, refs = _run("claude-code", "lingering", tmp_path, max_turns=3, timeout=60)
    assert time.monotonic() - started < 10
    assert result.kind is None and result.text == "Answered; a helper lingers." and result.exit_code == 0
    assert _group_gone(refs[0].pgid) and _gone(_child_pid(events))


def test_reservation_below_one_worst_case_call_is_refused_before_start(tmp_path: Path) -> None:
    result, ledger, events, refs = _run("claude-code", "answer", tmp_path, reservation=0.5, worst=0.6)
    assert result.kind == "budget_exhausted" and "max_cost_usd" in result.error
    assert refs == [] and events == [] and ledger.charges == []
    assert cli_cap_usd(2.0, 0.456) == 1.54 and cli_cap_usd(0.5, 0.5) is None
    assert cli_cap_usd(float("nan"), 0.1) is None and cli_cap_usd(2.0, float("inf")) is None


def test_a_raising_callback_kills_the_group_and_propagates(tmp_path: Path) -> None:
    refs: list[CommandRef] = []

    def charge(delta: float) -> bool:
        raise RuntimeError("store is gone")

    with pytest.raises(RuntimeError, match="store is gone"):
        asyncio.run(run_coding_cli(
            CliSpec(kind="claude-code", binary=str(FAKES / "claude")), prompt="scenario spend",
            workspace=tmp_path, reservation_usd=5.0, worst_call_usd=0.1, prices=CLAUDE_PRICES,
            redactor=Redactor([]), base_env=_base_env(), api_key=None, timeout=10, charge=charge,
            on_start=_started(refs), kill_grace=0.3))
    assert _group_gone(refs[0].pgid)


def test_cancelling_the_awaiting_task_kills_the_group(tmp_path: Path) -> None:
    refs: list[CommandRef] = []

    async def cancelled_after_a_while() -> None:
        await asyncio.wait_for(run_coding_cli(
            CliSpec(kind="claude-code", binary=str(FAKES / "claude")), prompt="scenario stubborn",
            workspace=tmp_path, reservation_usd=5.0, worst_call_usd=0.1, prices=CLAUDE_PRICES,
            redactor=Redactor([]), base_env=_base_env(), api_key=None, timeout=60, charge=lambda d: True,
            on_start=_started(refs), kill_grace=0.3), 1.0)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(cancelled_after_a_while())
    assert _group_gone(refs[0].pgid)


def test_async_callbacks_are_awaited(tmp_path: Path) -> None:
    charged: list[float] = []
    logged: list[dict] = []
    refs: list[CommandRef] = []

    async def charge(delta: float) -> bool:
        await asyncio.sleep(0)
        charged.append(delta)
        return sum(charged) < 0.5

    async def on_event(event: dict) -> None:
        logged.append(event)

    async def on_start(ref: CommandRef) -> None:
        _started(refs)(ref)

    result = asyncio.run(run_coding_cli(
        CliSpec(kind="claude-code", binary=str(FAKES / "claude")), prompt="scenario spend",
        workspace=tmp_path, reservation_usd=0.5, worst_call_usd=0.1, prices=CLAUDE_PRICES,
        redactor=Redactor([]), base_env=_base_env(), api_key=None, timeout=20, charge=charge,
        on_event=on_event, on_start=on_start, kill_grace=0.3))
    assert result.kind == "budget_exhausted" and charged[:2] == pytest.approx([0.3, 0.3])
    assert len(refs) == 1 and _group_gone(refs[0].pgid)
    assert logged and logged[-1]["spent_usd"] == pytest.approx(sum(charged))


# ------------------------------------------------------------------ codex


def test_codex_answer_priced_from_tokens(tmp_path: Path) -> None:
    result, ledger, _, refs = _run("codex", "answer", tmp_path)
    assert result.kind is None and result.text == "Codex is done." and result.turns == 1
    assert result.usage == {"input_tokens": 5000, "output_tokens": 1000, "cache_read_tokens": 15000,
                            "cache_write_tokens": 0, "prompt_tokens": 20000, "completion_tokens": 1000}
    assert result.cost_usd == pytest.approx(0.018125) == pytest.approx(ledger.total)
    assert _group_gone(refs[0].pgid)


def test_codex_flags_and_environment(tmp_path: Path) -> None:
    result, _, _, _ = _run("codex", "env", tmp_path, permissions="edit", model="gpt-5-codex",
                           api_key_env="CODEX_API_KEY")
    report = json.loads(result.text.replace("***", "REDACTED"))
    argv = report["argv"]
    assert argv[:1] == ["exec"] and argv[-1] == "-" and "--json" in argv
    assert argv[argv.index("--sandbox") + 1] == "workspace-write"
    assert argv[argv.index("--model") + 1] == "gpt-5-codex"
    assert "--max-turns" not in argv and "--max-budget-usd" not in argv
    assert set(report["env"]) <= {"PATH", "LANG", "TERM", "TMPDIR", "HOME", "CODEX_HOME", "CODEX_API_KEY",
                                  "LOOPDSL_COMMAND_ID"}
    assert report["env"]["CODEX_API_KEY"] == "REDACTED"
    assert report["stdin"].startswith("scenario env\n")
    read_only = build_argv(CliSpec(kind="codex", binary="codex"), None)
    assert read_only[read_only.index("--sandbox") + 1] == "read-only"


def test_codex_auth_failure_and_spend_kill(tmp_path: Path) -> None:
    auth, _, _, _ = _run("codex", "auth", tmp_path)
    assert auth.kind == "auth" and "401" in auth.error
    spent, ledger, _, refs = _run("codex", "spend", tmp_path, reservation=0.5)
    # $0.125 per turn: the fourth reaches $0.50 and the group is killed.
    assert spent.kind == "budget_exhausted" and ledger.charges[:4] == pytest.approx([0.125] * 4)
    assert spent.overspend_usd == pytest.approx(spent.cost_usd - 0.5) and spent.overspend_usd >= 0
    assert _group_gone(refs[0].pgid)
