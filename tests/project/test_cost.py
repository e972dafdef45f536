"""`loopdsl cost`: worst-case and typical figures against values computed by hand."""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

import loopdsl
from loopdsl.cli import cli

FIXTURE = Path(__file__).parents[1] / "data" / "project" / "cost" / "two-models.yaml"
DRAFT_PROMPT = "Write {{ inputs.n }} lines in a {{ inputs.tone }} tone."
CHECK_PROMPT = "Reply ok or redo. Text: {{ draft.text }}"


def table_price(key: str) -> tuple[float, float]:
    """USD per token (input, output), read straight from LiteLLM's JSON table."""
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations
    table = json.loads((Path(spec.submodule_search_locations[0]) / "model_prices_and_context_window_backup.json").read_text())
    return table[key]["input_cost_per_token"], table[key]["output_cost_per_token"]


def cost_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["cost", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def hand() -> dict[str, float]:
    mini_in, mini_out = table_price("gpt-4o-mini")
    haiku_in, haiku_out = table_price("claude-haiku-4-5")
    # Worst prompt: template bytes + each inserted value's cap (an integer input: 32 bytes; an enum
    # input: its longest JSON value '"plain"', 7 bytes), at 3 bytes a token; draft.text inserted
    # into check counts as draft's max_tokens (200).
    p_draft = math.ceil((len(DRAFT_PROMPT) + 32 + 7) / 3)
    p_check = math.ceil(len(CHECK_PROMPT) / 3) + 200
    return {
        "p_draft": p_draft, "p_check": p_check,
        "draft_attempt_tokens": p_draft + 200, "check_attempt_tokens": p_check + 100,
        "draft_attempt_cost": p_draft * mini_in + 200 * mini_out,
        "check_attempt_cost": p_check * haiku_in + 100 * haiku_out,
        # Typical: template size only, completion at max_tokens / 2.
        "typical_tokens": math.ceil(len(DRAFT_PROMPT) / 3) + 100 + math.ceil(len(CHECK_PROMPT) / 3) + 50,
        "typical_cost": math.ceil(len(DRAFT_PROMPT) / 3) * mini_in + 100 * mini_out
        + math.ceil(len(CHECK_PROMPT) / 3) * haiku_in + 50 * haiku_out,
    }


def test_worst_and_typical_per_run_match_hand_computed_values(hand: dict[str, float]) -> None:
    data = cost_json(str(FIXTURE), "--window-start", "2024-03-01T00:00:00+00:00")
    calls = {c["state"]: c for c in data["calls"]}
    assert calls["draft"]["prompt_tokens_worst"] == hand["p_draft"]
    assert calls["check"]["prompt_tokens_worst"] == hand["p_check"]
    assert (calls["draft"]["visits"], calls["draft"]["attempts"]) == (3, 2)
    assert (calls["check"]["visits"], calls["check"]["attempts"]) == (3, 1)
    worst = data["per_run"]["worst"]
    # draft: 3 visits x 2 attempts; check: 3 visits x 1 attempt; the budget (large) caps nothing.
    assert worst["tokens"] == 6 * hand["draft_attempt_tokens"] + 3 * hand["check_attempt_tokens"]
    assert worst["cost_usd"] == pytest.approx(6 * hand["draft_attempt_cost"] + 3 * hand["check_attempt_cost"], rel=1e-9)
    assert worst["capped_by"] == []
    typical = data["per_run"]["typical"]
    assert typical["tokens"] == hand["typical_tokens"]
    assert typical["cost_usd"] == pytest.approx(hand["typical_cost"], rel=1e-9)


def test_monthly_figures_count_cron_runs_in_30_days(hand: dict[str, float]) -> None:
    data = cost_json(str(FIXTURE), "--window-start", "2024-03-01T00:00:00+00:00")
    start = date(2024, 3, 1)
    weekdays = sum(1 for i in range(30) if (start + timedelta(days=i)).weekday() < 5)  # 09:00 on Mar 1..30
    assert data["runs_per_month"] == weekdays == 21
    assert data["per_month"]["typical"]["cost_usd"] == pytest.approx(21 * hand["typical_cost"], rel=1e-9)
    weekly = cost_json(str(FIXTURE), "--cadence", "weekly")
    assert weekly["runs_per_month"] == pytest.approx(30 / 7)
    assert weekly["per_month"]["worst"]["tokens"] == round(weekly["per_run"]["worst"]["tokens"] * 30 / 7)


def test_budget_caps_the_worst_case(tmp_path: Path, hand: dict[str, float]) -> None:
    capped = tmp_path / "capped.yaml"
    capped.write_text(FIXTURE.read_text().replace("budget: {tokens: 1000000, cost_usd: 10, steps: 100, wall_time: 5m}",
                                                   "budget: {tokens: 1000000, cost_usd: 0.0002, steps: 4, wall_time: 5m}"))
    worst = cost_json(str(capped))["per_run"]["worst"]
    # At most 4 attempts (steps), the dearest ones: here the 3 check attempts and 1 draft attempt by tokens.
    units = sorted([hand["draft_attempt_tokens"]] * 6 + [hand["check_attempt_tokens"]] * 3, reverse=True)
    assert worst["tokens"] == sum(units[:4])
    assert worst["cost_usd"] == 0.0002 and worst["capped_by"] == ["steps", "cost_usd"]
    assert worst["uncapped_tokens"] == 6 * hand["draft_attempt_tokens"] + 3 * hand["check_attempt_tokens"]


def test_fallbacks_are_priced_each_at_their_own_price_and_alias_price_is_used(tmp_path: Path, hand: dict[str, float]) -> None:
    loop = tmp_path / "fallback.yaml"
    loop.write_text(FIXTURE.read_text()
                    .replace("writer: {model: openai/gpt-4o-mini,", "writer: {model: openai/in-house, price: {input_per_mtok: 1, output_per_mtok: 2}, fallbacks: [openai/gpt-4o-mini],"))
    draft = next(c for c in cost_json(str(loop))["calls"] if c["state"] == "draft")
    own = (hand["p_draft"] * 1 + 200 * 2) / 1e6
    assert draft["models"] == ["openai/in-house", "openai/gpt-4o-mini"]
    assert draft["worst_cost_per_attempt"] == pytest.approx(own + hand["draft_attempt_cost"], rel=1e-9)
    assert draft["worst_tokens_per_attempt"] == 2 * hand["draft_attempt_tokens"]


def test_measured_runs_from_the_store_appear_beside_the_estimate(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = tmp_path / "replies.yaml"
    script.write_text("draft: ['three lines']\ncheck: ['ok']\n")
    costs = []
    for _ in range(2):
        result = loopdsl.run(FIXTURE, script=script, store=store, workdir=tmp_path)
        assert result.status == "completed"
        costs.append((result.cost_usd, result.tokens))
    measured = cost_json(str(FIXTURE), "--store", str(store))["measured"]
    assert measured["runs"] == 2
    assert measured["mean_cost_usd"] == pytest.approx(sum(c for c, _ in costs) / 2)
    assert measured["mean_tokens"] == pytest.approx(sum(t for _, t in costs) / 2)
    text = CliRunner().invoke(cli, ["cost", str(FIXTURE), "--store", str(store)]).stdout
    assert "measured     2 past run(s)" in text


def test_cost_never_imports_litellm() -> None:
    code = ("import sys\nfrom loopdsl.cli import cli\n"
            f"try:\n    cli.main(['cost', {str(FIXTURE)!r}, '--format', 'json'])\n"
            "except SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
            "assert 'litellm' not in sys.modules, 'cost imported litellm'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["loop"] == "two-models"


def test_a_loop_that_does_not_lint_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("loopdsl: 1\nname: bad\nstart: nowhere\nstates:\n  a: {end: completed}\n")
    result = CliRunner().invoke(cli, ["cost", str(bad)])
    assert result.exit_code == 2
    assert "has lint errors" in result.stderr


AGENT_FIXTURE = FIXTURE.with_name("agent.yaml")


def test_an_agent_worst_case_sums_its_growing_turns_and_a_cli_counts_its_cap() -> None:
    data = cost_json(str(AGENT_FIXTURE))
    calls = {c["state"]: c for c in data["calls"]}
    # P0: the prompt at 3 bytes a token, plus the tool's definition as it is sent.
    definition = {"type": "function", "function": {"name": "run_tests", "description": "Run the tests.",
                                                   "parameters": {"type": "object", "properties": {},
                                                                  "additionalProperties": False}}}
    p0 = math.ceil(len("Fix the failing tests.") / 3) + math.ceil(len(json.dumps(definition)) / 3)
    assert calls["fix"]["prompt_tokens_worst"] == p0
    # Turn t sends P0 + (t-1) x (max_tokens + 2 calls x 3000 bytes / 3 bytes a token).
    prompts = [p0 + (t - 1) * (1000 + 2 * 1000) for t in (1, 2, 3)]
    assert calls["fix"]["worst_tokens_per_attempt"] == sum(prompts) + 3 * 1000
    per_attempt = sum(prompts) * 1e-6 + 3 * 1000 * 2e-6
    assert calls["fix"]["worst_cost_per_attempt"] == pytest.approx(per_attempt, rel=1e-9)
    assert calls["review"]["worst_cost_per_attempt"] == 0.5
    assert data["per_run"]["worst"]["cost_usd"] == pytest.approx(2 * per_attempt + 0.5, rel=1e-9)


def test_an_mcp_server_counts_its_declared_schema_tokens_without_starting(tmp_path: Path) -> None:
    loop = tmp_path / "mcp.yaml"
    loop.write_text(
        "loopdsl: 1\nname: mcp-cost\n"
        "models:\n  coder: {model: openai/gpt-4o-mini, max_tokens: 100, price: {input_per_mtok: 1, output_per_mtok: 2}}\n"
        "tools:\n  issues:\n    description: Issues.\n"
        "    mcp: {command: [/nonexistent/never-started], schema_tokens: 750}\n"
        "    allow: [get_issue, list_issues]\n"
        "start: ask\nstates:\n  ask:\n    agent: {model: coder, prompt: Triage the issues now., tools: [issues], max_turns: 2,\n"
        "            max_tool_calls_per_turn: 1, tool_output_limit: 300}\n    next: done\n"
        "  done: {end: completed}\n")
    ask = {c["state"]: c for c in cost_json(str(loop))["calls"]}["ask"]
    # By hand: prompt 22 bytes / 3 -> 8 tokens, plus the declared 750 for the server's tools.
    p0 = 8 + 750
    assert ask["prompt_tokens_worst"] == p0
    # Turn 2 adds 100 (max_tokens) + 1 call x 300 bytes / 3 = 200: prompts 758 and 958.
    assert ask["worst_tokens_per_attempt"] == 758 + 958 + 2 * 100
    assert ask["worst_cost_per_attempt"] == pytest.approx((758 + 958) * 1e-6 + 200 * 2e-6, rel=1e-9)


@pytest.mark.parametrize("steps", ["budget: {steps: 5}\n", ""])
def test_counts_past_a_floats_range_are_bounded_by_the_steps_not_an_internal_error(tmp_path: Path, steps: str) -> None:
    """`max_visits: 1e+308` is an integer to the schema; times three attempts it once overflowed
    the float arithmetic of `cost` and `run --dry-run` (a fuzz of the pattern loops found it)."""
    loop = tmp_path / "huge.yaml"
    loop.write_text("loopdsl: 1\nname: huge\nmodels: {m: {model: openai/gpt-4o-mini, max_tokens: 100}}\n" + steps +
                    "start: a\nstates:\n  a:\n    llm: {model: m, prompt: hi}\n    max_visits: 1e+308\n"
                    "    retry: {max_attempts: 3}\n    next: b\n  b: {end: completed}\n")
    data = cost_json(str(loop))
    [plan] = data["calls"]
    assert plan["visits"] == (5 if steps else 10**15) and plan["attempts"] == 3
    dry = CliRunner().invoke(cli, ["run", str(loop), "--dry-run"])
    assert dry.exit_code == 0, dry.output
