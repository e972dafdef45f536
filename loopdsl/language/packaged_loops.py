"""Loops shipped by installed Python distributions (entry point group `loopdsl.loops`).

`pkg:NAME` names the loop `NAME.yaml` under the `loops/` folder of the package an
entry point points at; pinning those is pip's job.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import LoopdslError
from .files import YAML_SUFFIXES, is_dir, is_file

GROUP = "loopdsl.loops"


class PackageError(LoopdslError):
    """A loop package that cannot be found or loaded; exit 2."""


@dataclass(frozen=True)
class PackagedLoop:
    name: str
    path: Path
    distribution: str
    version: str


def installed_loops() -> list[PackagedLoop]:
    # Imported here: ~15 ms (email, zipfile, csv ...) that every `run` paid, used only for pkg: loops.
    from importlib import metadata

    found: list[PackagedLoop] = []
    for ep in metadata.entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist else ep.name
        version = ep.dist.version if ep.dist else "?"
        folder = _package_folder(ep.value)
        if folder is None or not is_dir(folder / "loops"):
            continue
        for item in sorted((folder / "loops").iterdir(), key=lambda p: p.name):
            if item.name.endswith(YAML_SUFFIXES) and is_file(item):
                found.append(PackagedLoop(item.name.rsplit(".", 1)[0], item, dist, version))
    return found


def _package_folder(module: str) -> Path | None:
    """The folder of an entry point's package, found without importing it: looking up a loop
    must run no package's code (and one broken package must not hide the others' loops)."""
    import importlib.util

    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: found, not imported
    except (ImportError, ValueError):  # no such module, or an empty or malformed name
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not locations or not all(part.isidentifier() for part in rest):
        return None
    return Path(locations[0]).joinpath(*rest)


def resolve_loop_ref(ref: str) -> Path:
    """`pkg:NAME` -> the packaged file; anything else is a path."""
    if not ref.startswith("pkg:"):
        return Path(ref)
    name = ref[4:]
    loops = installed_loops()
    for loop in loops:
        if loop.name == name:
            return loop.path
    known = ", ".join(sorted(p.name for p in loops)) or "none installed"
    raise PackageError(f"no installed loop package provides '{name}'", f"installed loops: {known}; `loopdsl patterns` lists them")


def child_loop_path(base_dir: Path, ref: str) -> Path:
    """The file a `loop:` state runs: the installed package's loop for `pkg:NAME` (PackageError
    when none provides it), else `ref` relative to the parent loop's folder, resolved."""
    if ref.startswith("pkg:"):
        return resolve_loop_ref(ref)
    return (base_dir / ref).resolve()
