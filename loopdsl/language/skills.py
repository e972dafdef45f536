"""SKILL.md files: the instructions an `llm` or `agent` state carries as system text.

A skill is a markdown file that must say WHEN it applies, what to READ, how to
JUDGE, what OUTPUT to give and when to STOP. Lint checks the sections are there
(as headings, so a reader can find them); the engine reads the text.
"""
from __future__ import annotations

import re
from pathlib import Path

from .agent_model import AgentAction
from .files import read_capped
from .model import LlmAction, Loop

REQUIRED_SECTIONS = ("WHEN", "READ", "JUDGE", "OUTPUT", "STOP")

# An ATX heading: up to 3 spaces, 1-6 '#', a space, the title.
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_FIRST_WORD = re.compile(r"[A-Za-z]+")


def _heading_words(text: str) -> set[str]:
    """The first word of every heading, upper-cased, outside fenced code blocks."""
    words: set[str] = set()
    in_fence: str | None = None
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if fence:
            marker = fence.group(1)
            if in_fence is None:
                in_fence = marker
            elif in_fence == marker:
                in_fence = None
            continue
        if in_fence is not None:
            continue
        heading = _HEADING.match(line)
        if heading:
            word = _FIRST_WORD.search(heading.group(1))
            if word:
                words.add(word.group(0).upper())
    return words


def missing_sections(text: str) -> list[str]:
    """The required section names that no heading starts with, in the canonical order."""
    present = _heading_words(text)
    return [name for name in REQUIRED_SECTIONS if name not in present]


def check_skill(path: str | Path) -> list[str]:
    """Problems with a SKILL.md, each a sentence; [] when it is fine."""
    file = Path(path)
    try:
        text = read_capped(file).decode("utf-8")
    except FileNotFoundError:
        return [f"skill file {file} does not exist"]
    except UnicodeDecodeError:
        return [f"skill file {file} is not UTF-8 text"]
    except OSError as exc:
        return [f"cannot read skill file {file}: {exc.strerror or exc}"]
    missing = missing_sections(text)
    if missing:
        names = ", ".join(missing)
        return [f"skill file {file.name} lacks the section{'s' if len(missing) > 1 else ''} {names}"]
    return []


def read_skill(path: str | Path) -> str:
    """The skill's text, as the engine puts it into the system message."""
    return read_capped(path).decode("utf-8").strip()


def skill_paths(loop: Loop) -> list[str]:
    """The skills of `loop`'s `llm` and `agent` states, as written (relative to its folder),
    each once: what a run reads and hands to the model, and what it pins."""
    found: list[str] = []
    for state in loop.states.values():
        action = state.action
        if isinstance(action, (LlmAction, AgentAction)) and action.skill and action.skill not in found:
            found.append(action.skill)
    return found


def read_skills(loop: Loop) -> dict[str, str]:
    """Each skill of `loop` (`skill_paths`) -> its text; OSError for one that cannot be read."""
    return {skill: read_skill(loop.base_dir / skill) for skill in skill_paths(loop)}
