"""Finding a project's loop files, loop tests and sub-loops."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from ..language.files import YAML_SUFFIXES, is_dir, read_head, walk
from ..language.model import Loop, LoopAction
from ..lint.loop_tree import loop_tree  # noqa: F401  (audit and export ask for it here)

TEST_SUFFIXES = (".test.yaml", ".test.yml")


def is_test_file(path: Path) -> bool:
    return path.name.endswith(TEST_SUFFIXES)


def find_test_files(paths: Sequence[str | Path]) -> list[Path]:
    """`*.test.yaml` files named or found under the given folders, once each, in order."""
    out: list[Path] = []
    seen: set[Path] = set()
    for given in paths:
        target = Path(given)
        candidates = [p for p in walk(target) if is_test_file(p)] if is_dir(target) else [target]
        for file in candidates:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                out.append(file)
    return out


def find_loop_files(root: Path) -> list[Path]:
    """Loop files (a top-level `loopdsl:` key) under `root`; loop tests are never loops."""
    from ..lint.report import is_loop_text

    out = []
    for file in walk(root) if root.is_dir() else [root]:
        if not file.name.endswith(YAML_SUFFIXES) or is_test_file(file):
            continue
        try:
            head = read_head(file)
        except OSError:
            continue
        if is_loop_text(head, explicit=not root.is_dir()):
            out.append(file)
    return out


def child_path(loop: Loop, action: LoopAction) -> Path | None:
    """Where a `loop:` state's child file is (None for an uninstalled `pkg:` reference)."""
    from ..language.packaged_loops import PackageError, child_loop_path

    try:
        return child_loop_path(loop.base_dir, action.path)
    except PackageError:
        return None


def sub_loop_files(loops: Iterable[Loop]) -> set[Path]:
    """Files that some loop runs as a child: parts of a loop, not loops on their own."""
    parts: set[Path] = set()
    for loop in loops:
        for state in loop.states.values():
            if isinstance(state.action, LoopAction):
                path = child_path(loop, state.action)
                if path is not None:
                    parts.add(path.resolve())
    return parts
