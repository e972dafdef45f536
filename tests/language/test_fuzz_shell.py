"""A small run of bench/fuzz_shell.py (the 10,000-case figure is in bench/README.md): commands
with placeholders in random bash contexts and hostile values are refused by lint, refused by
the engine, or run under real bash without the payload ever running."""
from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_fuzzer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_shell", REPO / "bench" / "fuzz_shell.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_shell"] = module
    spec.loader.exec_module(module)
    return module


FUZZ = _load_fuzzer()


@pytest.mark.parametrize("seed", [11, 12])
def test_no_generated_case_runs_an_injected_command(seed: int) -> None:
    counts, injections = asyncio.run(FUZZ.fuzz(150, seed))
    assert injections == []
    assert sum(counts.values()) == 150
    assert counts["refused"] > 0 and counts["clean"] > 0   # both kinds of case were generated


def test_the_fuzzer_would_see_an_injection(tmp_path: Path) -> None:
    """The oracle is real: a command that does run the payload is reported as INJECTED."""
    outcome = asyncio.run(FUZZ.run_case("printf '%s' {{ inputs.v }} > /dev/null; touch MARKER",
                                        "x", tmp_path, 0))
    assert outcome == ("INJECTED", "")
