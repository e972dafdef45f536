"""Generic fixtures and suite-wide settings shared by the test suite."""
from __future__ import annotations

import compileall
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from stub_server import StubServer

import loopdsl

# Hypothesis profiles. `ci` (the default, so `pytest -n auto` in CI uses it) runs half the
# examples of the property tests that scale with the profile (tests/scaled.py), without a
# per-example deadline (a loaded machine is not a bug) and without writing a .hypothesis
# folder; `thorough` (HYPOTHESIS_PROFILE=thorough) runs their full counts. Tests whose count
# is part of what they assert (the budget properties: >= 1,000 cases) keep it in every profile.
settings.register_profile("ci", max_examples=50, deadline=None, database=None)
settings.register_profile("thorough", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once, in the process that starts the xdist workers
        _compile_the_package()
    # Under pytest-xdist (`-n`), distribute as `load` does but keep each `xdist_group` on one
    # worker: a module whose tests share an expensive module-scoped setup (a venv with a package
    # built into it, a browser, LiteLLM imported in-process) marks itself
    # `pytestmark = pytest.mark.xdist_group("NAME")` and pays that setup once, not once per
    # worker its tests happen to land on. Other modes asked for on the command line are kept.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the tests marked `slow` first.

    xdist hands tests out in collection order, so a minute-long end-to-end test collected near
    the end (tests/temporal sorts late) starts when the other worker has nothing left to do and
    stretches the wall time by its whole length. Started first, the long ones overlap each
    other and the many short tests fill the gaps. The order within each kind is kept, so a
    module's tests stay together and share their module-scoped setup.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _compile_the_package() -> None:
    """Write the bytecode of every loopdsl module before any test starts a process.

    The suite starts hundreds of `python -m loopdsl` processes. Where PYTHONDONTWRITEBYTECODE
    is set (as on this project's machines and CI) no process writes the bytecode it compiles,
    so each one compiled every module it imported from source again: about 0.15 s of CPU a
    `loopdsl run` on a fresh checkout, and on a working copy for every module changed since
    its bytecode was last written. compileall writes it whatever the variable says; Python
    then reads it wherever it is current. A folder that cannot be written is left as it is.
    """
    compileall.compile_dir(str(Path(loopdsl.__file__).parent), quiet=2)


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    """An OpenAI-compatible stub on 127.0.0.1 (free port), serving only during the test."""
    server = StubServer(host="127.0.0.1", port=0).start()
    try:
        yield server
    finally:
        server.stop()
