"""Running a coding-agent CLI (Claude Code or Codex) for an `agent: {cli: ...}` state.

The API, for the agent action:

    spec = CliSpec(kind="claude-code", binary="claude", extra_args=(), model="claude-sonnet-4-5",
                   max_turns=8, permissions="read", api_key_env="ANTHROPIC_API_KEY")
    prices = prices_for(spec.model, alias.price)          # None: refuse, the spend is unpriceable
    worst = worst_call_usd(prices, spec.model)            # None: the alias must give the sizes
    result = await run_coding_cli(
        spec, prompt=text, workspace=path, reservation_usd=max_cost_usd, worst_call_usd=worst,
        prices=prices, redactor=run_redactor,
        base_env={"PATH": ..., "LANG": ...}, api_key=secret_value, timeout=600.0,
        charge=ledger_charge, on_event=log, on_start=record_ref)
    result.as_result()  # {text, stop, kind, error, cost_usd, overspend_usd, usage, turns, ...}

What it guarantees:
- The CLI runs in `workspace` in its own session, with the prompt on stdin, a fresh config
  home for this attempt only (a temp dir as HOME and CLAUDE_CONFIG_DIR / CODEX_HOME, removed
  afterwards, or by a later attempt when a kill cut this one off: `coding_cli_home`), no
  user or project settings (`--setting-sources ""`, `--strict-mcp-config`) and exactly PATH,
  LANG, TERM, TMPDIR (from `base_env`; codex: a TMPDIR in the home) plus its own API key and
  the alias's `api_base` (claude: ANTHROPIC_BASE_URL; codex: a `-c` model provider speaking
  the Responses API). Nothing here reads `os.environ`.
- Permissions: claude gets only the built-in tools of its level (`--tools`) and a permission
  mode that confines them to the workspace (`dontAsk` for read, `acceptEdits` for edit);
  codex gets `--sandbox read-only|workspace-write` (with /tmp excluded; its TMPDIR is a
  directory of the fresh home). Flags verified against Claude Code
  2.1.332 and codex-cli 0.171.0 (tests/adapters/test_coding_cli_real.py).
- The CLI's own cap is the reservation minus one worst-case call (`--max-budget-usd`; codex
  takes none), so it stops itself before loopdsl has to. A reservation that cannot cover one
  worst-case call is refused before anything starts (`budget_exhausted`).
- Spend is charged as events arrive (for codex also as its session log records each model
  request, see `coding_cli_rollout`): `charge(delta_usd)` for each increase of what the
  events say was spent (tokens priced by class with `prices`, or the CLI's cumulative cost,
  whichever is higher), before the event goes to `on_event`. `charge` returning False means
  the reservation is reached: the whole process group is killed at once. Deltas still
  arriving afterwards (lines already in the pipe) are charged too: spend is spend, and what
  was spent past the reservation is `overspend_usd`, never hidden. `charge`, `on_event` and
  `on_start` may be plain functions or coroutine functions.
- At the end, at the timeout, at a budget kill, on cancellation, or when a callback raises,
  the process group (and whatever left it, see `process_tree`) is killed before returning.
- Every event goes to `on_event` redacted (large ones reduced to a capped excerpt), with
  `tools`: the tool uses it started or finished as loopdsl tool notes (`coding_cli_tools`);
  `on_start(ref)` gets the `CommandRef` (pgid, marker, start time) once the CLI runs, to be
  committed so a resumed run can kill it. The result's text and errors are redacted.
- `kind` (when the run did not answer): `max_turns`, `auth`, `budget_exhausted`, `timeout`,
  `shell_exit` (any other failure, non-zero exit included).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..language.model import Price
from ..language.prices import model_info
from ..runtime.process_tree import CommandRef
from ..runtime.redaction import Redactor
from ..runtime.scratch import remove_folder
from .coding_cli_events import CLAUDE, CODEX, KINDS, TokenPrices, looks_like_auth, zero_usage
from .coding_cli_home import make_home
from .coding_cli_process import CliRun, Outcome, supervise
from .coding_cli_rollout import RolloutTail

__all__ = ["CliSpec", "CliResult", "TokenPrices", "run_coding_cli", "build_argv", "build_env",
           "cli_cap_usd", "prices_for", "worst_call_usd", "PERMISSIONS", "DEFAULT_KEY_ENV"]

PERMISSIONS = ("read", "edit", "full")
# The variable each CLI reads its key from, and so where loopdsl puts it, whatever variable
# the alias's `api_key_env` took it from: `codex exec` reads CODEX_API_KEY (OPENAI_API_KEY
# only after a stored login, and each attempt's config home starts empty), claude reads
# ANTHROPIC_API_KEY (both checked against codex-cli 0.171.0 and Claude Code 2.1.332).
DEFAULT_KEY_ENV = {CLAUDE: "ANTHROPIC_API_KEY", CODEX: "CODEX_API_KEY"}
_ENV_PASSED = ("PATH", "LANG", "TERM", "TMPDIR")
_CONFIG_DIR_VAR = {CLAUDE: "CLAUDE_CONFIG_DIR", CODEX: "CODEX_HOME"}
# Claude Code's built-in tools per permission level, passed as `--tools` so that no other
# built-in (Task, EnterWorktree, Cron*, ...) is offered at all. They are deliberately NOT
# passed as `--allowedTools`: an allowed tool runs on any path (a read of ~/.ssh, a write to
# /etc), while unlisted ones are confined by the permission mode to the working directory
# (`dontAsk`: reads there, everything else denied; `acceptEdits`: edits there too).
_READ_TOOLS = ("Read", "Glob", "Grep")
_EDIT_TOOLS = (*_READ_TOOLS, "Edit", "Write", "NotebookEdit")
_NEVER_TOOLS = ("Bash", "WebFetch", "WebSearch")  # below `full`: no shell, no network
_CLAUDE_MODE = {"read": "dontAsk", "edit": "acceptEdits", "full": "bypassPermissions"}
_CODEX_SANDBOX = {"read": "read-only", "edit": "workspace-write", "full": "danger-full-access"}
# The provider codex is pointed at when the alias has an `api_base` (codex 0.171 speaks only
# the Responses API to it: `wire_api = "chat"` is refused).
_CODEX_PROVIDER = "loopdsl"
KILL_GRACE_S = 1.0


@dataclass(frozen=True)
class CliSpec:
    """Which CLI, how to start it (from the model alias) and what it may do (from the state)."""

    kind: str  # "claude-code" | "codex"
    binary: str  # the alias's `cli_path` (a name on PATH or a path)
    extra_args: tuple[str, ...] = ()  # the alias's extra args, placed before loopdsl's flags
    model: str | None = None
    max_turns: int | None = None  # claude only; codex has no turn cap
    permissions: str = "read"
    api_key_env: str | None = None  # where the caller found the key; default DEFAULT_KEY_ENV[kind]
    api_base: str | None = None  # the alias's endpoint (a proxy, a gateway, a loopback stub)

    def key_env(self) -> str:
        return self.api_key_env or DEFAULT_KEY_ENV[self.kind]


@dataclass
class CliResult:
    text: str | None
    stop: str  # "answer" | "max_turns" | "error"
    kind: str | None  # None when answered; else an error kind (see the module docstring)
    error: str | None
    cost_usd: float
    overspend_usd: float
    usage: dict[str, int]
    turns: int
    exit_code: int | None
    duration_s: float
    cap_usd: float | None = None  # what the CLI was given as its own cap
    reported_cost_usd: float | None = None
    stderr: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_result(self) -> dict[str, Any]:
        return {"text": self.text, "stop": self.stop, "kind": self.kind, "error": self.error,
                "cost_usd": self.cost_usd, "overspend_usd": self.overspend_usd, "usage": dict(self.usage),
                "turns": self.turns, "exit_code": self.exit_code, "duration_s": self.duration_s,
                "cap_usd": self.cap_usd}


def prices_for(model: str | None, alias_price: Price | None = None) -> TokenPrices | None:
    """What the CLI's tokens cost: the alias's `price:` when it has one, else the price
    table's entry for `model`; None when neither knows (never priced as $0: the caller
    refuses to run a CLI whose spend it cannot price)."""
    if alias_price is not None:
        return TokenPrices.from_price(alias_price)
    entry = model_info(model) if model else None
    return TokenPrices.from_entry(entry) if entry is not None else None


def worst_call_usd(prices: TokenPrices, model: str | None, *, max_input_tokens: int | None = None,
                   max_output_tokens: int | None = None) -> float | None:
    """One call at its worst: a full context window written to the cache (the dearest input
    class) and a full output. Sizes come from the arguments or the price table; None when
    neither gives them."""
    entry = (model_info(model) if model else None) or {}
    window = max_input_tokens or _count(entry.get("max_input_tokens"))
    output = max_output_tokens or _count(entry.get("max_output_tokens"))
    if not window or not output:
        return None
    per_input = max(prices.input_per_mtok, prices.cache_write_per_mtok)
    return (window * per_input + output * prices.output_per_mtok) / 1_000_000


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def cli_cap_usd(reservation_usd: float, worst_call_usd: float) -> float | None:
    """The cap handed to the CLI: the reservation minus one worst-case call (the CLI checks
    its cap only between calls, so one call may cross it), rounded down to a cent; None when
    nothing is left."""
    if not (math.isfinite(reservation_usd) and math.isfinite(worst_call_usd)):
        return None
    left = math.floor((reservation_usd - max(worst_call_usd, 0.0)) * 100) / 100
    return left if left > 0 else None


def build_argv(spec: CliSpec, cap_usd: float | None) -> list[str]:
    """The command line. Loopdsl's flags come after the alias's extra args so that, where a
    flag is given twice, ours (the last) decide permissions, caps and settings."""
    if spec.kind not in KINDS:
        raise ValueError(f"unknown coding-agent CLI {spec.kind!r}; expected one of {', '.join(KINDS)}")
    if spec.permissions not in PERMISSIONS:
        raise ValueError(f"permissions must be one of {', '.join(PERMISSIONS)}, not {spec.permissions!r}")
    model = ["--model", spec.model] if spec.model else []
    if spec.kind == CODEX:
        # `-` makes codex read the prompt from stdin.
        # workspace-write also lets commands write anywhere in /tmp (other runs' files
        # included): only the workspace and the attempt's own TMPDIR (build_env) stay writable.
        tmp = ["-c", "sandbox_workspace_write.exclude_slash_tmp=true"] if spec.permissions == "edit" else []
        return [spec.binary, "exec", *spec.extra_args, "--json", "--sandbox", _CODEX_SANDBOX[spec.permissions],
                *tmp, "--skip-git-repo-check", *_codex_provider(spec), *model, "-"]
    argv = [spec.binary, *spec.extra_args, "-p", "--output-format", "stream-json", "--verbose"]
    if spec.max_turns is not None:
        argv += ["--max-turns", str(int(spec.max_turns))]
    if cap_usd is not None:
        argv += ["--max-budget-usd", f"{cap_usd:.2f}"]
    argv += ["--permission-mode", _CLAUDE_MODE[spec.permissions]]
    if spec.permissions != "full":
        argv += ["--tools", ",".join(_READ_TOOLS if spec.permissions == "read" else _EDIT_TOOLS),
                 # Denied as well, explicitly, in case `--tools` is overridden by the alias's args.
                 "--disallowedTools", ",".join(_NEVER_TOOLS if spec.permissions == "edit"
                                               else (*_NEVER_TOOLS, *_EDIT_TOOLS[len(_READ_TOOLS):]))]
    return argv + ["--strict-mcp-config", "--setting-sources", "", *model]


def _codex_provider(spec: CliSpec) -> list[str]:
    """`-c` overrides pointing codex at the alias's `api_base` (key in CODEX_API_KEY, as for
    the built-in provider); none without an `api_base` (codex's built-in OpenAI provider)."""
    if not spec.api_base:
        return []
    # JSON strings are valid TOML basic strings: quotes and backslashes stay escaped.
    table = (f"{{name={json.dumps(_CODEX_PROVIDER)}, base_url={json.dumps(spec.api_base)}, "
             f"env_key={json.dumps(DEFAULT_KEY_ENV[CODEX])}, wire_api=\"responses\"}}")
    return ["-c", f"model_provider={json.dumps(_CODEX_PROVIDER)}", "-c", f"model_providers.{_CODEX_PROVIDER}={table}"]


def build_env(spec: CliSpec, base_env: Mapping[str, str], home: Path, api_key: str | None) -> dict[str, str]:
    """PATH LANG TERM TMPDIR from `base_env`, HOME and the CLI's config dir in `home`, its
    own API key and (claude) the alias's endpoint: nothing else (no other secret, no user
    config)."""
    env = {name: base_env[name] for name in _ENV_PASSED if name in base_env}
    env["HOME"] = str(home)
    env.setdefault("TMPDIR", str(home))
    env[_CONFIG_DIR_VAR[spec.kind]] = str(home / "config")
    if spec.kind == CODEX:
        # Its own temp dir, removed with the home: the one writable place outside the workspace
        # (see build_argv); and codex sets up its helper commands only when its config home is
        # not inside TMPDIR.
        env["TMPDIR"] = str(home / "tmp")
    if spec.api_base and spec.kind == CLAUDE:  # codex gets its endpoint as config (build_argv)
        env["ANTHROPIC_BASE_URL"] = spec.api_base
    if api_key:
        env[DEFAULT_KEY_ENV[spec.kind]] = api_key
    return env


async def run_coding_cli(
    spec: CliSpec,
    *,
    prompt: str,
    workspace: Path,
    reservation_usd: float,
    worst_call_usd: float,
    prices: TokenPrices,
    redactor: Redactor,
    base_env: Mapping[str, str],
    api_key: str | None,
    timeout: float | None,
    charge: Callable[[float], Any],  # -> bool, or an awaitable of one
    on_event: Callable[[dict[str, Any]], Any] | None = None,
    on_start: Callable[[CommandRef], Any] | None = None,
    kill_grace: float = KILL_GRACE_S,
) -> CliResult:
    """Run the CLI once (one attempt) and say how it ended; see the module docstring.
    Failures of the CLI are in the result, never raised; a raising callback is re-raised
    after the CLI's group is killed."""
    started = time.monotonic()
    redact = Redactor([*redactor.values, *([api_key] if api_key else [])])
    # Codex takes no cap of its own: there the reservation alone bounds it.
    cap = cli_cap_usd(reservation_usd, worst_call_usd) if spec.kind == CLAUDE else None
    if not reservation_usd > 0 or (spec.kind == CLAUDE and cap is None):
        return _refused(f"max_cost_usd ${reservation_usd:.2f} does not cover one worst-case call "
                        f"(${worst_call_usd:.2f}); raise max_cost_usd", started)
    argv = build_argv(spec, cap)
    if not Path(workspace).is_dir():
        return _refused(f"the workspace {workspace} is not a directory", started, kind="shell_exit")
    run = CliRun(spec.kind, spec.key_env(), spec.max_turns, reservation_usd, prices, redact, charge, on_event)
    home = make_home()
    try:
        (home / "config").mkdir(mode=0o700)
        (home / "tmp").mkdir(mode=0o700)
        env = build_env(spec, base_env, home, api_key)
        if spec.kind == CODEX:  # its stream reports usage only at the end: watch its session log
            run.live = RolloutTail(home / "config")
        outcome = await supervise(argv, env, workspace, prompt, run, timeout, kill_grace, on_start)
    finally:
        remove_folder(home)
    return _result(run, outcome, cap, redact, started)


def _refused(message: str, started: float, kind: str = "budget_exhausted") -> CliResult:
    """An attempt that never started the CLI (nothing was spent)."""
    return CliResult(text=None, stop="error", kind=kind, error=message, cost_usd=0.0,
                     overspend_usd=0.0, usage=_usage(zero_usage()), turns=0, exit_code=None,
                     duration_s=time.monotonic() - started)


def _result(run: CliRun, outcome: Outcome, cap: float | None, redact: Redactor, started: float) -> CliResult:
    state = run.state
    cost = run.meter.charged_usd
    kind, error = _classify(run, outcome, redact)
    text = redact(state.text) if state.text is not None else None
    stop = "answer" if kind is None else ("max_turns" if kind == "max_turns" else "error")
    return CliResult(
        text=text, stop=stop, kind=kind, error=error, cost_usd=cost,
        overspend_usd=max(0.0, cost - run.reservation_usd), usage=_usage(state.usage), turns=state.turns,
        exit_code=outcome.exit_code, duration_s=time.monotonic() - started, cap_usd=cap,
        # .error: the kept tail may start inside a secret, whose cut-off rest is hidden too.
        reported_cost_usd=state.reported_cost_usd, stderr=redact.error(outcome.stderr),
        extra={"events": run.events, "skipped_lines": run.skipped})


def _usage(classes: Mapping[str, int]) -> dict[str, int]:
    """Usage by class, plus the prompt/completion totals every other state reports."""
    prompt = classes["input_tokens"] + classes["cache_read_tokens"] + classes["cache_write_tokens"]
    return {**classes, "prompt_tokens": prompt, "completion_tokens": classes["output_tokens"]}


def _classify(run: CliRun, outcome: Outcome, redact: Redactor) -> tuple[str | None, str | None]:
    """(error kind, message) of how the run ended; (None, None) for an answer."""
    state = run.state
    said = [*state.errors, outcome.stderr[-4000:]]
    if outcome.start_error is not None:
        return "shell_exit", outcome.start_error
    if outcome.budget_killed:
        return "budget_exhausted", (f"spent ${run.meter.charged_usd:.4f} of the ${run.reservation_usd:.2f} "
                                    "reserved; the CLI's process group was killed")
    if state.subtype == "error_max_budget_usd":
        return "budget_exhausted", f"the CLI stopped at its own cap after spending ${run.meter.charged_usd:.4f}"
    if outcome.gave_up and state.hopeless is not None:
        return "auth", redact.error(f"the CLI could not authenticate (check {run.key_env}): {state.hopeless}; "
                                    "its process group was killed")
    if outcome.timed_out:
        return "timeout", "the CLI did not finish in time; its process group was killed"
    if state.subtype == "error_max_turns":
        return "max_turns", f"the CLI used its turns ({run.max_turns or state.turns}) without finishing"
    failed = outcome.exit_code != 0 or state.is_error or not state.finished
    if failed and looks_like_auth(said):
        return "auth", redact.error(f"the CLI could not authenticate (check {run.key_env}): "
                                    f"{_last(said)}")
    if outcome.exit_code != 0:
        return "shell_exit", redact.error(f"the CLI exited with status {outcome.exit_code}: {_last(said)}")
    if state.is_error or not state.finished or state.text is None:
        return "shell_exit", redact.error(f"the CLI ended without a final answer: {_last(said)}")
    return None, None


def _last(texts: list[str]) -> str:
    for text in reversed(texts):
        if text.strip():
            return text.strip()[-1000:]
    return "(no message)"

