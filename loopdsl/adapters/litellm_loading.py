"""LiteLLM, imported once: on first use, or in the background from the start of a real run.

`import litellm` takes seconds (more under load). Only real model calls need it: scripted
runs, `test`, `audit`, `lint` and `cost` never import it. A real run starts the import in
a background thread as the process starts (`start_loading`), so it overlaps reading the
loop, opening the store and making the worktree; whoever needs LiteLLM then waits for that
one import (`wait_until_loaded`) instead of starting its own. It is started only for a loop
that calls models, because a process that ends sooner waits at exit for the import to end.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
from typing import Any

_lock = threading.Lock()
_loaded = threading.Event()
_thread: threading.Thread | None = None
_failure: BaseException | None = None
_ready: Any = None  # LiteLLM, once imported and set up
_owned_process = False


def claim_process() -> None:
    """For a process loopdsl owns (the CLI, a worker), two things once LiteLLM is imported:

    - its first call's lazy imports (the proxy's types, the logging setup: ~70 modules,
      ~0.13 CPU-s) are made by an offline call with a mock response, so they overlap the
      run's start in the background import instead of delaying its first model call;
    - every object then alive moves to the collector's permanent generation, so later full
      collections (and the ones at exit) no longer walk LiteLLM's ~380,000 objects.

    Not for a host application's process: its LiteLLM callbacks would see the mock call, and
    its objects alive then would never be freed if they formed a cycle."""
    global _owned_process
    _owned_process = True


def owns_process() -> bool:
    """Whether `claim_process` was called: this process is loopdsl's own (not a host application's)."""
    return _owned_process


def _set_defaults() -> None:
    # LiteLLM reads these while importing; a user's explicit value is kept.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")


def ensure_litellm() -> Any:
    """Import LiteLLM the way loopdsl needs it: offline price map, no ./.env, quiet.

    Called from the background thread or directly; a second caller waits on Python's
    import lock for the first one's import, so LiteLLM is imported once either way. The
    setup runs once too: every model call asks for the module (setting a logger's level
    walks all of LiteLLM's loggers, ~0.1 ms a call in a fan-out of 1,000 calls).
    """
    global _ready
    if _ready is not None:
        return _ready
    _set_defaults()
    litellm = _import_without_collecting()
    litellm.suppress_debug_info = True
    # Never fetch a HuggingFace tokenizer over the network to count tokens:
    # non-OpenAI counts are estimates either way and get our safety margin.
    litellm.disable_hf_tokenizer_download = True
    litellm.num_retries = 0
    if not os.environ.get("LITELLM_LOG"):
        # Each loopdsl.run() is its own asyncio loop; LiteLLM's background logging worker
        # warns when it moves to the next one. Errors still show; LITELLM_LOG overrides.
        logging.getLogger("LiteLLM").setLevel(logging.ERROR)
    if _owned_process:
        _make_the_first_call_lazy_imports(litellm)
        gc.freeze()
    _ready = litellm
    _loaded.set()
    return litellm


def _import_without_collecting() -> Any:
    # The import makes ~380,000 objects, none of them garbage, and the collector's full
    # collections walk them again and again as they pile up. Paused for the whole process
    # meanwhile; a collector someone else turned off stays off. With the freeze that follows
    # in a process loopdsl owns: a one-call `loopdsl run` takes 2.9 CPU-s instead of 4.8
    # (bench/README.md, "LiteLLM's import").
    collecting = gc.isenabled()
    gc.disable()
    try:
        import litellm
    finally:
        if collecting:
            gc.enable()
    return litellm


def _make_the_first_call_lazy_imports(litellm: Any) -> None:
    # `mock_response` is LiteLLM's own offline answer: no request, no key, no tokens spent.
    # A warm-up that fails (a LiteLLM that moved things) only leaves the first call slower.
    try:
        litellm.completion(model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "warm-up"}],
                           mock_response="ok", max_tokens=1)
    except Exception:  # noqa: BLE001 - an optimisation, never a reason for a run to fail
        pass


def _load_in_background() -> None:
    global _failure
    try:
        ensure_litellm()
    except BaseException as exc:  # noqa: BLE001 - kept and re-raised by the waiter, in its own thread
        _failure = exc
        _loaded.set()


def start_loading() -> None:
    """Start importing LiteLLM in a background thread (once); returns at once."""
    global _thread
    with _lock:
        if _thread is not None or _loaded.is_set():
            return
        _set_defaults()  # in this thread: os.environ is not changed under the main thread's feet
        # Not a daemon: a daemon thread killed mid-import at interpreter exit can abort the
        # process ("FATAL: exception not rethrown"); exit waits for the import to end instead.
        _thread = threading.Thread(target=_load_in_background, name="loopdsl-import-litellm", daemon=False)
        _thread.start()


def is_loaded() -> bool:
    return _loaded.is_set() and _failure is None


async def wait_until_loaded() -> Any:
    """LiteLLM, once imported; waits in a worker thread so the event loop keeps running."""
    import asyncio  # here: the CLI imports this module at start, and `lint` has no use for asyncio (~20 ms)

    if not _loaded.is_set():
        if _thread is None:
            start_loading()
        await asyncio.to_thread(_loaded.wait)
    if _failure is not None:
        raise _failure
    return ensure_litellm()


__all__ = ["claim_process", "ensure_litellm", "is_loaded", "start_loading", "wait_until_loaded"]
