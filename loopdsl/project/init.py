"""`loopdsl init`: scaffold a loop project from a bundled pattern.

The project gets the pattern's loop with every file it depends on (skills, sub-loops,
imports) at the same places relative to one another as in the package (loops/ and
skills/ side by side), so the relative paths inside the loop keep resolving; a file the
package keeps elsewhere is copied next to the loop and its reference rewritten. Then the
reply script, a loop test, the JSON Schema (for editors), a .gitignore for the run store,
a pre-commit configuration and a README. Nothing is overwritten without `force`.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..language.errors import LoopdslError
from ..language.files import exists, leads_outside, read_capped
from ..language.loader import load_document
from .install_source import InstallSource
from .pattern_tests import generic_test, pattern_test

STORE_IGNORE = ".loopdsl/"


class InitError(LoopdslError):
    """A scaffold that cannot be written; exit 2."""


@dataclass(frozen=True)
class Pattern:
    name: str
    path: Path
    summary: str


def data_dir() -> Path:
    return Path(str(resources.files("loopdsl") / "data"))


def list_patterns() -> list[Pattern]:
    found = []
    loops = data_dir() / "loops"
    for file in sorted(loops.glob("*.y*ml")) if loops.is_dir() else []:
        if file.name.endswith((".test.yaml", ".test.yml")):
            continue
        doc, _ = load_document(file)  # the hardened loader: a shipped file is still just data
        data = doc.data if doc is not None else None
        if not isinstance(data, dict) or "loopdsl" not in data:
            continue
        description = " ".join(str(data.get("description", "")).split())
        summary = description.split(". ")[0].rstrip(".") + "." if description else ""
        found.append(Pattern(str(data.get("name", file.stem)), file, summary))
    return found


def find_pattern(name: str) -> Pattern:
    """The bundled pattern called `name`, or an InitError naming the close ones."""
    patterns = {p.name: p for p in list_patterns()}
    if name not in patterns:
        import difflib

        close = difflib.get_close_matches(name, list(patterns), n=1)
        raise InitError(f"no bundled pattern named {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                        "patterns: " + ", ".join(sorted(patterns)) + " (`loopdsl init --list` describes them)")
    return patterns[name]


def _dependencies(loop_file: Path) -> list[Path]:
    """Every file the pattern's loop needs (itself first), resolved."""
    from ..language.diagnostics import LoopError
    from ..lint.pipeline import load_loop
    from ..lint.lockfile import dependencies

    try:
        loop = load_loop(loop_file)
    except LoopError as exc:
        raise InitError(f"the bundled pattern {loop_file.name} does not lint: {exc.diagnostics[0].message}",
                        "please report it") from None
    return [Path(p) for p in dependencies(loop) if not p.startswith("pkg:")]


def _placement(file: Path) -> Path:
    """Where a package file goes in the project (relative): loops/... or skills/... as in the package."""
    for folder in ("loops", "skills"):
        root = (data_dir() / folder).resolve()
        try:
            return Path(folder) / file.resolve().relative_to(root)
        except ValueError:
            continue
    return Path("loops") / "vendor" / file.name


def _rewrite_references(text: str, source: Path, target: Path, moved: dict[Path, Path]) -> str:
    """Rewrite relative references (skill:, loop:, imports) whose target moved differently from this file."""
    import re

    def fix(match: re.Match[str]) -> str:
        ref = match.group("ref")
        resolved = (source.parent / ref).resolve()
        if resolved not in moved:
            return match.group(0)
        new = Path(os.path.relpath(moved[resolved], target.parent)).as_posix()
        return match.group(0).replace(ref, new) if new != ref else match.group(0)

    pattern = re.compile(r"(?P<key>\b(?:skill|loop|path)\s*:\s*[\"']?)(?P<ref>[^\s\"'{}#,]+)")
    return pattern.sub(fix, text)


# Which published schema an editor should use for a file, by how its name ends.
_SCHEMA_BY_SUFFIX = ((".test.yaml", "test.schema.json"), (".replies.yaml", "replies.schema.json"))
SCHEMA_FILES = ("loop.schema.json", "test.schema.json", "replies.schema.json")


def _schema_line(text: str, target: Path) -> str:
    """Point the editor's `$schema=` modeline at the project's copy of the file's schema.
    Test files and reply scripts get one when they have none; other YAML (a loop's imported
    library, say) is only re-pointed, since the loop schema does not describe it."""
    import re

    schema = next((name for suffix, name in _SCHEMA_BY_SUFFIX if target.name.endswith(suffix)), "loop.schema.json")
    rel = Path(os.path.relpath(Path("schemas") / schema, target.parent)).as_posix()
    modeline = re.compile(r"(#\s*yaml-language-server:\s*\$schema=)\S+")
    if modeline.search(text):
        return modeline.sub(lambda m: m.group(1) + rel, text, count=1)
    if schema == "loop.schema.json":
        return text
    return f"# yaml-language-server: $schema={rel}\n{text}"


LOOP_NAME = r"^[a-z][a-z0-9-]*$"  # the schema's pattern for `name:`


def _renamed(pattern: Pattern, name: str | None) -> str:
    """The scaffolded loop's name: `name`, checked like the schema checks `name:`, or the pattern's."""
    import re

    if name is None or name == pattern.name:
        return pattern.name
    if not re.match(LOOP_NAME, name):
        raise InitError(f"--name {name!r} is not a loop name",
                        "use lowercase letters, digits and '-', starting with a letter, e.g. --name repo-triage")
    return name


def _set_name(text: str, old: str, new: str, key: str) -> str:
    """Rewrite the top-level `key: ...old...` line (name, loop, script) for a renamed loop."""
    import re

    line = re.compile(rf"(?m)^({key}:\s*)(\S*?){re.escape(old)}(\.\S+)?[ \t]*$")
    return line.sub(lambda m: f"{m.group(1)}{m.group(2)}{new}{m.group(3) or ''}", text, count=1)


def planned_files(pattern: Pattern, name: str | None = None, install: InstallSource | None = None) -> dict[Path, str]:
    """Relative path in the project -> text, for every file `init` writes (the loop named `name`;
    the pre-commit hook installs `install`, by default the running loopdsl)."""
    name = _renamed(pattern, name)
    deps = _dependencies(pattern.path)
    moved = {dep.resolve(): _placement(dep) for dep in deps}
    if name != pattern.name:
        loop_place = moved[pattern.path.resolve()]
        moved[pattern.path.resolve()] = loop_place.with_name(name + loop_place.suffix)
    files: dict[Path, str] = {}
    for dep in deps:
        target = moved[dep.resolve()]
        text = dep.read_text(encoding="utf-8")
        if dep.suffix in (".yaml", ".yml"):
            text = _schema_line(_rewrite_references(text, dep.resolve(), target, moved), target)
        files[target] = text
    loop_target = moved[pattern.path.resolve()]
    script = data_dir() / "loops" / "scripts" / f"{pattern.path.stem}.replies.yaml"
    script_rel = None
    if script.is_file():
        script_rel = f"scripts/{name}.replies.yaml"
        script_target = loop_target.parent / script_rel
        files[script_target] = _schema_line(script.read_text(encoding="utf-8"), script_target)
    test_text = pattern_test(pattern.name) or generic_test(name, loop_target.name, script_rel)
    if name != pattern.name:
        files[loop_target] = _set_name(files[loop_target], pattern.name, name, "name")
        test_text = _set_name(_set_name(test_text, pattern.name, name, "loop"), pattern.name, name, "script")
    test_target = loop_target.parent / f"{loop_target.stem}.test.yaml"
    files[test_target] = _schema_line(test_text, test_target)
    for schema in SCHEMA_FILES:
        files[Path("schemas") / schema] = (data_dir() / schema).read_text(encoding="utf-8")
    install = install or running_install()
    files[Path(".pre-commit-config.yaml")] = pre_commit_config(install)
    files[Path("README.md")] = readme(pattern, name, loop_target, script_rel, install)
    return files


def scaffold(directory: Path, name: str, *, force: bool = False, loop_name: str | None = None,
             install: InstallSource | None = None) -> list[Path]:
    """Write the project from pattern `name` (its loop named `loop_name`); returns the files
    written (relative to `directory`)."""
    pattern = find_pattern(name)
    if directory.exists() and not directory.is_dir():
        raise InitError(f"{directory} exists and is not a folder", "give a new or existing folder")
    files = planned_files(pattern, loop_name, install)
    existing = sorted(str(rel) for rel in files if (directory / rel).exists())
    if existing and not force:
        shown = ", ".join(existing[:6]) + (f" and {len(existing) - 6} more" if len(existing) > 6 else "")
        raise InitError(f"{directory} already has {shown}; nothing was written",
                        "use --force to overwrite them, or choose an empty folder")
    for rel in [*files, Path(".gitignore")]:
        elsewhere = leads_outside(directory, directory / rel)
        if elsewhere is not None:
            raise InitError(f"{directory / rel} leads to {elsewhere} through a symbolic link, outside "
                            f"{directory}; nothing was written",
                            "init writes only inside its folder: remove the link, or choose another folder")
    current = _checked_targets(directory, [*files, Path(".gitignore")])
    written: list[Path] = []
    try:
        for rel, text in files.items():
            target = directory / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            written.append(rel)
        ignore = directory / ".gitignore"
        if STORE_IGNORE not in current.split():
            # Appended, never replaced: a project's own ignores stay.
            prefix = "" if not current or current.endswith("\n") else "\n"
            ignore.write_text(current + prefix + "# loopdsl run store (runs, events, worktrees)\n" + STORE_IGNORE + "\n",
                              encoding="utf-8")
            written.append(Path(".gitignore"))
    except OSError as exc:  # a read-only mount, a folder of another user, /proc
        done = f" ({len(written)} file(s) were written: {', '.join(map(str, written[:4]))})" if written else ""
        raise InitError(f"cannot write in {directory}: {exc.strerror or exc}{done}",
                        "choose a folder you may write") from None
    return written


def _checked_targets(directory: Path, targets: list[Path]) -> str:
    """Before anything is written: every file to write is absent or a regular file, and every
    folder on its way a folder (a FIFO there hung init; a folder or a file named like a folder
    was an internal error after half the files were written). Returns the current .gitignore."""
    for rel in targets:
        for part in [*reversed(rel.parents[:-1]), rel]:
            path = directory / part
            try:
                mode = os.stat(path).st_mode  # through links: they were checked to stay inside the folder
            except FileNotFoundError:
                break
            except OSError as exc:
                raise InitError(f"cannot look at {path}: {exc.strerror or exc}; nothing was written", "") from None
            if not (stat.S_ISREG(mode) if part == rel else stat.S_ISDIR(mode)):
                kind = "a regular file" if part == rel else "a folder"
                raise InitError(f"{path} is in the way: it is not {kind}; nothing was written",
                                "move it aside, or choose another folder")
    ignore = directory / ".gitignore"
    try:
        return read_capped(ignore).decode("utf-8") if exists(ignore) else ""
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        raise InitError(f"cannot read {ignore}: {why}; nothing was written",
                        "fix or move the file, then run init again") from None


def running_install() -> InstallSource:
    from .install_source import running_install as pinned

    return pinned()


def pre_commit_config(install: InstallSource) -> str:
    """The hooks at the same loopdsl: its repository at its commit, else a local hook that
    pip-installs `install.pip_spec` in pre-commit's own environment."""
    from .export import yaml_quoted

    head = "# pre-commit (https://pre-commit.com): `pip install pre-commit && pre-commit install`.\nrepos:\n"
    if install.repo and install.rev:
        return head + (f"  - repo: {yaml_quoted(install.repo)}\n    rev: {yaml_quoted(install.rev)}\n    hooks:\n"
                       "      - id: loopdsl-lint\n        exclude: \\.test\\.ya?ml$\n")
    return head + f"""  - repo: local
    hooks:
      - id: loopdsl-lint
        name: loopdsl lint
        entry: loopdsl lint
        language: python
        additional_dependencies: [{yaml_quoted(install.pip_spec)}]
        files: \\.(ya?ml)$
        exclude: \\.test\\.ya?ml$
"""


def readme(pattern: Pattern, name: str, loop_target: Path, script_rel: str | None, install: InstallSource) -> str:
    loop_path = loop_target.as_posix()
    script = f"loops/{script_rel}" if script_rel else None
    test_path = (loop_target.parent / f"{loop_target.stem}.test.yaml").as_posix()
    import shlex

    named = f" --name {name}" if name != pattern.name else ""
    spec = shlex.quote(install.pip_spec)
    return f"""# {name}

{pattern.summary}

Scaffolded by `loopdsl init --pattern {pattern.name}{named}`.

| file | what it is |
|---|---|
| `{loop_path}` | the loop: states, gates, budget, schedule |
| `skills/` | the instructions the loop's model calls carry (WHEN / READ / JUDGE / OUTPUT / STOP) |
| `{script or 'loops/scripts/'}` | scripted replies: run the loop offline, no API key |
| `{test_path}` | a loop test: builds a small repository, runs the loop on it, checks the result |
| `schemas/` | JSON Schemas of loops, tests and reply scripts (each file's first line points its editor at one) |
| `.pre-commit-config.yaml` | `loopdsl lint` on every commit |

## Check it

```bash
loopdsl lint loops/        # schema and semantic checks
loopdsl test               # the loop tests, offline, each in a throwaway repository
loopdsl audit --suggest    # readiness score out of 100, and how to raise it
loopdsl cost {loop_path}   # worst-case and typical spend, per run and per month
```

## Run it

With a provider key in the environment (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, ...), from the
repository the loop should work on:

```bash
loopdsl run {loop_path}
loopdsl runs                   # the run store is .loopdsl/ (git-ignored)
```

Offline, with the scripted replies, run it the way the loop test does: `loopdsl test --keep`
keeps the throwaway repository so you can look at what the run did.

## Schedule it

```bash
loopdsl schedule {loop_path}                                   # the next run times
loopdsl schedule {loop_path} --export github-actions --pip-spec {spec} -o .github/workflows/{name}.yml
loopdsl schedule {loop_path} --export crontab                  # or a crontab line
```
"""
