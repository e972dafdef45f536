"""Property tests: no input makes the loader or the lint pipeline raise.

A smaller, shrinking cousin of bench/fuzz_lint.py (whose mutators and pipeline it reuses):
about 1,500 generated inputs in all with `HYPOTHESIS_PROFILE=thorough`, half that in the
default `ci` profile (tests/conftest.py). Every diagnostic must carry a rule id and a line
that is 0 (whole file) or a real 1-based line of the input.
"""
from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scaled import scaled

from loopdsl.language.diagnostics import Diagnostic
from loopdsl.language.loader import load_text

REPO = Path(__file__).resolve().parents[2]


def _load_fuzz_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_lint", REPO / "bench" / "fuzz_lint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_lint"] = module
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz_module()
SEEDS = fuzz.seed_texts()
PIPELINE = fuzz.build_pipeline()
TOP_LEVEL_KEYS = ["name", "description", "schedule", "inputs", "secrets", "models", "budget",
                  "workspace", "imports", "gates", "start", "states", "outputs", "unattended",
                  "concurrency"]
SEED_JSON = [json.dumps(doc.data) for doc, _ in map(load_text, SEEDS) if doc is not None]


def examples(count: int) -> Any:
    # 500 + 500 + 200 + 150 + 150 + 60 = 1,560 inputs in the `thorough` hypothesis profile,
    # scaled by the loaded profile's max_examples against hypothesis' default of 100 (the
    # default `ci` profile, tests/conftest.py, runs half); derandomized so CI runs are repeatable.
    return settings(max_examples=scaled(count), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

yaml_alphabet = st.sampled_from(
    list("abcxyz019 -:?[]{},#&*!|>'\"%@`\t\n\r~.<=\\") + ["\u2028", "\u00e9", "\x00", "\ufeff",
                                                         "\ud800", "\x85", "\x07"])
yaml_soup = st.text(alphabet=yaml_alphabet, max_size=200) | st.lists(
    st.sampled_from(fuzz.SPECIAL_TOKENS + fuzz.KEYS + fuzz.VALUES + fuzz.TAGS + ["\n", "  "]),
    max_size=60).map("".join)


@st.composite
def mutated_loops(draw: st.DrawFn) -> str | bytes:
    """A valid loop with 1-4 of the fuzz script's mutations, chosen by hypothesis."""
    rng: random.Random = draw(st.randoms(use_true_random=False))
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        text = draw(st.sampled_from(fuzz.TEXT_MUTATORS))(rng, text)
    return fuzz.to_bytes(rng, text) if draw(st.booleans()) and draw(st.booleans()) else text


# Plain Python draws from a seed hypothesis picks (as hostile_structure below): hypothesis' own
# recursive strategies cost several times the lint of the document they build.
NOISE_SCALARS = [None, True, False, "", "x", "done", "draft", "30s", "{{ x }}", "{% if %}", "$(rm)", "a.b",
                 float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.5, 1e308, 5e-324]
NOISE_LEAVES = 40


def dsl_like_value(rng: random.Random, leaves: list[int]) -> Any:
    """A scalar, or a list or mapping (the DSL's keys) of such values; `leaves` is the budget left."""
    roll = rng.random()
    if leaves[0] <= 0 or roll < 0.5:
        leaves[0] -= 1
        return rng.randint(-5, 10**6) if rng.random() < 0.2 else rng.choice(NOISE_SCALARS)
    if roll < 0.7:
        return [dsl_like_value(rng, leaves) for _ in range(rng.randint(0, 4))]
    return {rng.choice(fuzz.KEYS): dsl_like_value(rng, leaves) for _ in range(rng.randint(0, 6))}


def dsl_like_mapping(rng: random.Random, keys: list[str], size: int) -> dict[str, Any]:
    leaves = [NOISE_LEAVES]
    return {rng.choice(keys): dsl_like_value(rng, leaves) for _ in range(rng.randint(0, size))}


@st.composite
def dsl_like_documents(draw: st.DrawFn) -> str:
    """Schema-shaped noise: a mapping with the DSL's own keys, often near-valid."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    data = dsl_like_mapping(rng, fuzz.KEYS, 10)
    shape = rng.randint(0, 2)
    if shape == 1:  # start from a real loop and overwrite parts of it
        data = {**json.loads(rng.choice(SEED_JSON)), **data}
    elif shape == 2:  # a versioned loop file with only a few top-level sections, any type
        data = {"loopdsl": 1, **dsl_like_mapping(rng, TOP_LEVEL_KEYS, 4)}
    return json.dumps(data)


def assert_diagnostics_sound(source: str | bytes, diags: list[Any]) -> None:
    raw = source if isinstance(source, bytes) else source.encode("utf-8", "surrogatepass")
    text = raw.decode("utf-8", "replace")
    # YAML breaks lines at \n, \r, NEL, LS and PS; one more for the line after the last.
    last_line = sum(text.count(brk) for brk in "\n\r\x85\u2028\u2029") + 1
    for d in diags:
        assert isinstance(d, Diagnostic)
        assert isinstance(d.rule, str) and d.rule, d
        assert d.message, d
        assert d.line == 0 or 1 <= d.line <= last_line, (d, last_line)
        assert d.col >= 0 and (d.col >= 1 or d.line == 0), d


def check_loader(source: str | bytes) -> None:
    doc, diags = load_text(source, path="fuzz.yaml")
    assert_diagnostics_sound(source, diags)
    assert (doc is None) == bool(diags)
    if doc is not None:
        assert isinstance(doc.data, dict)
        json.dumps(doc.data)  # plain data only: no ruamel types, no cycles


def check_pipeline(source: str | bytes) -> None:
    failure = fuzz.check_case(PIPELINE, "fuzz.yaml", source, timeout=20.0)
    assert failure is None, f"{PIPELINE.description} failed:\n{failure}"


@examples(500)
@given(st.binary(max_size=300))
def test_loader_survives_random_bytes(source: bytes) -> None:
    check_loader(source)


@examples(500)
@given(yaml_soup)
def test_loader_survives_yaml_token_soup(source: str) -> None:
    check_loader(source)


@pytest.mark.slow
@examples(200)
@given(mutated_loops())
def test_loader_survives_mutated_loops(source: str | bytes) -> None:
    check_loader(source)


@pytest.mark.slow
@examples(150)
@given(mutated_loops())
def test_lint_pipeline_survives_mutated_loops(source: str | bytes) -> None:
    check_pipeline(source)


@pytest.mark.slow
@examples(150)
@given(dsl_like_documents())
def test_lint_pipeline_survives_dsl_shaped_noise(source: str) -> None:
    check_pipeline(source)


@pytest.mark.slow
@examples(60)
@given(st.integers(min_value=0, max_value=2**32), st.sampled_from(range(len(SEEDS))))
def test_lint_pipeline_survives_hostile_structure(case: int, seed: int) -> None:
    """Jinja nested past the parser's recursion, deep YAML, many states, odd names."""
    check_pipeline(fuzz.hostile_structure(random.Random(case), SEEDS[seed], huge=False))


@pytest.mark.slow
def test_fuzz_script_finds_nothing_on_a_short_run(tmp_path: Path) -> None:
    """The script itself runs end to end and reports zero failures on 40 cases."""
    code = fuzz.main(["--cases", "40", "--seed", "7", "--out", str(tmp_path)])
    assert code == 0, sorted(p.name for p in tmp_path.iterdir())


def test_the_harness_catches_escapes_internal_errors_bad_positions_and_hangs() -> None:
    """The checks above are only worth something if check_case can fail."""
    import time as time_module

    from loopdsl.language.diagnostics import Severity

    def crash(path: str, source: str | bytes) -> list[Any]:
        raise KeyError("boom")

    def internal(path: str, source: str | bytes) -> list[Any]:
        return [Diagnostic(path, 0, 0, Severity.ERROR, "internal-error", "TypeError at x.py:1")]

    def negative_line(path: str, source: str | bytes) -> list[Any]:
        return [Diagnostic(path, -1, 1, Severity.ERROR, "some-rule", "m")]

    def hang(path: str, source: str | bytes) -> list[Any]:
        time_module.sleep(5)
        return []

    outcomes = {name: fuzz.check_case(fuzz.Pipeline(name, fn), "f.yaml", "a: 1\n", timeout=0.3)
                for name, fn in [("crash", crash), ("internal", internal),
                                 ("negative", negative_line), ("hang", hang)]}
    assert "KeyError: 'boom'" in outcomes["crash"]
    assert outcomes["internal"].startswith("InternalError")
    assert outcomes["negative"].startswith("BadDiagnostic")
    assert outcomes["hang"].startswith("Timeout")


def test_fuzz_cases_are_reproducible_by_seed_and_index() -> None:
    seeds = fuzz.seed_texts()
    assert fuzz.make_case(5, 123, seeds) == fuzz.make_case(5, 123, seeds)
    assert len({str(fuzz.make_case(5, i, seeds)) for i in range(30)}) > 25
