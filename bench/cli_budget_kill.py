"""How fast a coding-agent CLI that keeps spending is stopped once its reservation is reached.

The fake `claude` of the tests (tests/data/fake_cli) prints a $0.30 message every 50 ms and
never ends; the reservation is $1.00. Measured: from the charge that reaches the reservation
to `run_coding_cli` returning with the CLI's whole process group killed, and the overspend.

    python bench/cli_budget_kill.py [--runs N]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from loopdsl.adapters.coding_cli import CliSpec, TokenPrices, run_coding_cli
from loopdsl.runtime.redaction import Redactor

FAKE = Path(__file__).resolve().parents[1] / "tests" / "data" / "fake_cli" / "claude"
PRICES = TokenPrices(input_per_mtok=3.0, output_per_mtok=15.0, cache_read_per_mtok=0.3, cache_write_per_mtok=3.75)


def one_run(workspace: Path) -> tuple[float, float, bool]:
    """(ms from the refused charge to the return, overspend in USD, group gone)."""
    spent = [0.0]
    reached: list[float] = []
    pgids: list[int] = []

    def charge(delta: float) -> bool:
        spent[0] += delta
        if spent[0] >= 1.0 and not reached:
            reached.append(time.monotonic())
        return spent[0] < 1.0

    result = asyncio.run(run_coding_cli(
        CliSpec(kind="claude-code", binary=str(FAKE)), prompt="scenario spend", workspace=workspace,
        reservation_usd=1.0, worst_call_usd=0.1, prices=PRICES, redactor=Redactor([]),
        base_env={"PATH": os.environ.get("PATH", "")}, api_key=None, timeout=30, charge=charge,
        on_start=lambda ref: pgids.append(ref.pgid)))
    latency = (time.monotonic() - reached[0]) * 1000
    assert result.kind == "budget_exhausted", result
    return latency, result.overspend_usd, _group_gone(pgids[0])


def _group_gone(pgid: int, wait_s: float = 2.0) -> bool:
    """Killed processes stay zombies until their parent (init, for the orphans) reaps
    them; the group counts as gone once no live member is left."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        members = [p for p in os.listdir("/proc") if p.isdigit() and _stat(p)[1] == pgid]
        if all(_stat(p)[0] in ("Z", "X", None) for p in members):
            return True
        time.sleep(0.02)
    return False


def _stat(pid: str) -> tuple[str | None, int | None]:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2])
    except (OSError, IndexError, ValueError):
        return None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_run(Path(tmp)) for _ in range(args.runs)]
    latencies = [r[0] for r in runs]
    print(f"{args.runs} runs: reservation reached -> group killed and result returned: "
          f"median {statistics.median(latencies):.0f} ms, max {max(latencies):.0f} ms; "
          f"overspend max ${max(r[1] for r in runs):.2f} (one $0.30 message); "
          f"groups left alive: {sum(not r[2] for r in runs)}")


if __name__ == "__main__":
    main()
