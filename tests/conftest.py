"""Generic fixtures and suite-wide settings shared by the test suite."""
from __future__ import annotations

import compileall
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stub_server import StubServer

import loopdsl
from loopdsl.adapters.litellm_loading import claim_process

def _load_hypothesis_profile() -> None:
    """Hypothesis profiles. `ci` (the default, so `pytest -n auto` in CI uses it) runs half the
    examples of the property tests that scale with the profile (tests/scaled.py), without a
    per-example deadline (a loaded machine is not a bug) and without writing a .hypothesis
    folder; `thorough` (HYPOTHESIS_PROFILE=thorough) runs their full counts. Tests whose count
    is part of what they assert (the budget properties: >= 1,000 cases) keep it in every profile.

    Only in a process that runs tests: the one that starts the xdist workers never needs
    Hypothesis, whose import (~0.2 s) would delay every worker's start."""
    from hypothesis import settings

    settings.register_profile("ci", max_examples=50, deadline=None, database=None)
    settings.register_profile("thorough", max_examples=100, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    # A test process is as much loopdsl's as the CLI's: when a test first imports LiteLLM, the
    # first call's lazy imports are made then, and the objects then alive stay out of later
    # collections (~1 CPU-s a worker; a test's objects alive at that moment are kept to the
    # end, which a test process can afford).
    claim_process()
    starts_workers = not hasattr(config, "workerinput") and (getattr(config.option, "numprocesses", None) or 0) > 0
    if not starts_workers:
        _load_hypothesis_profile()
    if not hasattr(config, "workerinput"):  # once, in the process that starts the xdist workers
        _compile_the_package()
        if starts_workers:
            _rewrite_ahead(config)
    # Under pytest-xdist (`-n`), distribute as `load` does but keep each `xdist_group` on one
    # worker: a module whose tests share an expensive module-scoped setup (a venv with a package
    # built into it, a browser, LiteLLM imported in-process) marks itself
    # `pytestmark = pytest.mark.xdist_group("NAME")` and pays that setup once, not once per
    # worker its tests happen to land on. Other modes asked for on the command line are kept.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
    # A worker learns the mode from the controller (below): it parses the command line itself,
    # before `-n` implies `load`, so it would not tag its tests with their groups and the
    # controller's loadgroup scheduler would see no group at all.
    if getattr(config, "workerinput", {}).get("loopdsl_loadgroup"):
        config.option.loadgroup = True


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, controller side: tell each worker whether tests are grouped."""
    node.workerinput["loopdsl_loadgroup"] = node.config.option.dist == "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers per core the process may use.

    Much of the suite waits rather than computes: for a Temporal server and its workers, a
    killed run's lock to expire, a browser, a stub server's slow reply, a child process's
    start. With one worker per core a core sits idle through each such wait (28% of two cores
    measured idle at `-n 2`); the other workers' tests fill it. On two cores (bench/README.md,
    sixth pass): `-n 3` 215 s, `-n 4` 187-212 s, at 84% and 95% of the cores. Not more: every
    worker pays its own fixed costs (collection, LiteLLM's import, its `loopdsl` fork server),
    and the timing-bound tests then run on a machine busier than it has cores.
    """
    return 2 * _usable_cores()


@pytest.hookimpl(trylast=True)  # after pytest-xdist has tagged the grouped tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the tests marked `slow` first, and check that grouped tests are grouped.

    xdist hands tests out in collection order, so a minute-long end-to-end test collected near
    the end (tests/temporal sorts late) starts when the other worker has nothing left to do and
    stretches the wall time by its whole length. Started first, the long ones overlap each
    other and the many short tests fill the gaps. The order within each kind is kept, so a
    module's tests stay together and share their module-scoped setup. (Running the pure
    layers' tests last, to fill the idle cores of the run's waiting end, measured slower:
    bench/README.md, seventh pass.)

    In an xdist worker that groups tests, each test of a group has an id ending in `@GROUP`.
    Where a pytest release changes how ids are kept, xdist's tag is lost without a word and each
    group's setup runs once per worker again (seen with pytest 9.2): such tests then fail.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if config.getoption("loadgroup", False):
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                item.stash[_UNGROUPED] = True


_UNGROUPED = pytest.StashKey[bool]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(_UNGROUPED, False):
        pytest.fail("pytest-xdist did not tag this test with its xdist_group, so groups are ignored: "
                    "check the pytest and pytest-xdist pins in pyproject.toml", pytrace=False)


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


def _rewrite_ahead(config: pytest.Config) -> None:
    """Write pytest's assertion-rewritten bytecode, once, for all workers: of every test module
    and conftest, and of every module of a distribution that registers a pytest plugin (pytest
    rewrites those too: Hypothesis's ~100 modules, anyio's, xdist's).

    Each xdist worker imports them all, and pytest rewrites each module's asserts before
    compiling it (for this suite ~6 s of CPU a worker for the tests, ~1.3 s for the plugins'
    modules). It keeps the result in __pycache__ and reads it back wherever it is current, but
    writes it only where Python may write bytecode, so under PYTHONDONTWRITEBYTECODE (set on
    this project's machines and CI) every worker rewrote every module again. Rewritten here
    once (split over forked processes, one a core), the workers read it. This uses pytest's own
    rewriting functions and its rewrite hook's list of plugin modules, which are not public: if
    they move, nothing is written and each worker rewrites the modules, as before.
    """
    try:
        from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc, get_cache_dir
    except ImportError:
        return
    tests = Path(__file__).resolve().parent
    sources = [source for source in sorted(tests.rglob("*.py"))
               if (source.name.startswith("test_") or source.name == "conftest.py")
               and not {"data", "node_modules"} & set(source.relative_to(tests).parts)]
    sources += _plugin_modules(config)
    stale = []
    for source in sources:
        pyc = get_cache_dir(source) / (source.name[:-3] + PYC_TAIL)
        if _read_pyc(source, pyc) is None:
            stale.append((source, pyc))
    if not hasattr(os, "fork"):
        _rewrite(stale, config)
        return
    # Plain forks (no thread has started yet): each child rewrites every n-th module and ends;
    # nothing crosses a pipe, so nothing is pickled (a pool would pickle its function by a
    # module name, and which `conftest` module that name finds depends on what was collected).
    shares = min(len(stale), _usable_cores())
    children = []
    for index in range(shares):
        pid = os.fork()
        if pid == 0:
            try:
                _rewrite(stale[index::shares], config)
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)


def _plugin_modules(config: pytest.Config) -> list[Path]:
    """The source files of the modules pytest marked for rewriting as plugin distributions'
    (its rewrite hook's `_must_rewrite`), found without importing them."""
    hook = getattr(config.pluginmanager, "rewrite_hook", None)
    files: list[Path] = []
    for name in sorted(getattr(hook, "_must_rewrite", ())):
        try:
            spec = importlib.util.find_spec(name) if "." not in name else None
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        origin = Path(spec.origin)
        files += sorted(origin.parent.rglob("*.py")) if spec.submodule_search_locations else [origin]
    return files


def _rewrite(modules: list[tuple[Path, Path]], config: pytest.Config) -> None:
    from _pytest.assertion.rewrite import _rewrite_test, _write_pyc_fp

    for source, pyc in modules:
        try:
            stat, code = _rewrite_test(source, config)
            pyc.parent.mkdir(exist_ok=True)
            partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
            with partial.open("wb") as out:
                _write_pyc_fp(out, stat, code)
            os.replace(partial, pyc)  # whole or absent: a worker may read it at any moment
        except (OSError, SyntaxError):
            pass  # the worker rewrites it (and reports a syntax error) itself


def _usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    """An OpenAI-compatible stub on 127.0.0.1 (free port), serving only during the test."""
    server = StubServer(host="127.0.0.1", port=0).start()
    try:
        yield server
    finally:
        server.stop()
