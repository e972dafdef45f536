"""The loop test `loopdsl init` writes beside a pattern: the one shipped with the pattern
(`loops/<name>.test.yaml`: its `setup` builds the small repository the reply script was
written for, with fixed dates so cited commit hashes match), else a starting point."""
from __future__ import annotations

_HEADER = """# A loop test: `loopdsl test` runs it offline in a temporary directory (never in this
# repository): `setup` builds a small repository, the loop runs on it with scripted replies
# (no API key), and `expect` says what must hold. See docs/cli.md, "loopdsl test".
"""


def pattern_test(name: str) -> str | None:
    """The test file shipped beside a bundled pattern (`loops/<name>.test.yaml`), if any."""
    from .init import data_dir

    path = data_dir() / "loops" / f"{name}.test.yaml"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def generic_test(name: str, loop_file: str, script: str | None) -> str:
    """A starting point for a pattern without a written test: it checks only the spend caps
    the budget promises, so the first edit is to say what the run must do."""
    lines = [_HEADER.rstrip("\n"), "# Say what a good run does: set expect.status, expect.path and the files it writes.",
             f"loop: {loop_file}"]
    if script:
        lines.append(f"script: {script}")
    lines += ["expect:", "  status: completed"]
    return "\n".join(lines) + "\n"
