"""Generic fixtures and suite-wide settings shared by the test suite."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings
from stub_server import StubServer

# Hypothesis profiles. `ci` (the default, so `pytest -n auto` in CI uses it) runs half the
# examples of the property tests that scale with the profile (tests/test_fuzz.py), without a
# per-example deadline (a loaded machine is not a bug) and without writing a .hypothesis
# folder; `thorough` (HYPOTHESIS_PROFILE=thorough) runs their full counts. Tests whose count
# is part of what they assert (the budget properties: >= 1,000 cases) keep it in every profile.
settings.register_profile("ci", max_examples=50, deadline=None, database=None)
settings.register_profile("thorough", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (`-n`), distribute as `load` does but keep each `xdist_group` on one
    # worker: a module whose tests share an expensive module-scoped setup (a venv with a package
    # built into it, a browser, LiteLLM imported in-process) marks itself
    # `pytestmark = pytest.mark.xdist_group("NAME")` and pays that setup once, not once per
    # worker its tests happen to land on. Other modes asked for on the command line are kept.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    """An OpenAI-compatible stub on 127.0.0.1 (free port), serving only during the test."""
    server = StubServer(host="127.0.0.1", port=0).start()
    try:
        yield server
    finally:
        server.stop()
