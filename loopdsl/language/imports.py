"""`imports:` — reusable gates, model aliases and tools from other YAML files.

An imported file (a *library*) has top-level `gates:`, `models:` and/or `tools:` (optionally
`loopdsl: 1`, `description:` and its own `imports:`). Paths are relative to the
importing file. `{path, as: alias}` puts the library's names under `alias.name`;
a bare path merges them as they are. Tools are offered to models, whose function names
allow no '.', so an aliased tool is `alias__name`. Missing files, cycles and two definitions of
one name are lint errors that point at both places.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from .agent_model import build_tool
from .diagnostics import Diagnostic, Severity
from .files import is_file, leads_to_yaml, read_capped
from .loader import Document, load_document
from .model import Gate, ModelAlias, YamlPath
from .model_build import build_gate, build_model_alias
from .price_checks import params_cost_diagnostics, price_diagnostic

LIBRARY_KEYS = ("loopdsl", "description", "imports", "gates", "models", "tools")
Location = tuple[str, int, int]  # display path, line, col


@dataclass
class ImportResult:
    gates: dict[str, Gate] = field(default_factory=dict)
    models: dict[str, ModelAlias] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)  # name -> agent_model.ToolDef
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # every file imported, transitively
    # Where each (kind, name) is defined, for clash reports and for rules that point at
    # an imported definition.
    origins: dict[tuple[str, str], Location] = field(default_factory=dict)


@dataclass
class _Frame:
    """One file on the import chain: for cycle reports."""

    file: Path
    shown: str
    imported_at: Location | None  # where the previous file imports it

# Deeper than any loop needs, and far from Python's recursion limit (a 500-deep chain hit it).
MAX_IMPORT_DEPTH = 32


class ImportCache:
    """Libraries already resolved in this lint session, by resolved path."""

    def __init__(self) -> None:
        self.libraries: dict[Path, ImportResult] = {}


def display_path(importer_shown: str, relative: str) -> str:
    """The imported file's path as the user would type it from where they ran lint."""
    return os.path.normpath(os.path.join(os.path.dirname(importer_shown), relative))


def _err(path: str, where: tuple[int, int], rule: str, message: str, hint: str,
         related: tuple[tuple[str, int, int, str], ...] = ()) -> Diagnostic:
    return Diagnostic(path, where[0], where[1], Severity.ERROR, rule, message, hint, related)


def _import_items(doc: Document) -> Iterator[tuple[int, str, str | None]]:
    raw = doc.data.get("imports") if isinstance(doc.data, dict) else None
    for i, item in enumerate(raw if isinstance(raw, list) else ()):
        if isinstance(item, str):
            yield i, item, None
        elif isinstance(item, dict) and isinstance(item.get("path"), str):
            alias = item.get("as")
            yield i, item["path"], alias if isinstance(alias, str) else None


def resolve_imports(
    doc: Document,
    source: Path,
    *,
    cache: ImportCache | None = None,
    _chain: tuple[_Frame, ...] = (),
) -> ImportResult:
    """Gates and models that `doc`'s `imports:` bring in (namespaced), with diagnostics."""
    cache = cache if cache is not None else ImportCache()
    chain = _chain or (_Frame(source.resolve(), doc.path, None),)
    result = ImportResult()
    for index, relative, alias in _import_items(doc):
        item_at = doc.locate(("imports", index, "path")) if alias is not None or isinstance(
            doc.data["imports"][index], dict) else doc.locate(("imports", index))
        file = (source.parent / relative).resolve()
        shown = display_path(doc.path, relative)
        if len(chain) > MAX_IMPORT_DEPTH:  # each level is a few Python frames deep
            result.diagnostics.append(_err(doc.path, item_at, "import-invalid",
                                           f"imports nest more than {MAX_IMPORT_DEPTH} files deep here",
                                           "import the shared file directly instead of through a chain"))
            continue
        on_chain = next((f for f in chain if f.file == file), None)
        if on_chain is not None:
            if on_chain.imported_at is not None:
                related = ((*on_chain.imported_at, f'"{on_chain.shown}" is imported here first'),)
            else:
                related = ((on_chain.shown, 1, 1, "the file being linted"),)
            cycle = " -> ".join([f.shown for f in chain[chain.index(on_chain):]] + [shown])
            result.diagnostics.append(_err(
                doc.path, item_at, "import-cycle", f"import cycle: {cycle}",
                "imports must form a tree: move the shared gates/models into a file both import",
                related))
            continue
        if not is_file(file):
            result.diagnostics.append(_err(
                doc.path, item_at, "missing-file", f'imported file "{relative}" does not exist',
                "the path is relative to the importing file's folder"))
            continue
        elsewhere = leads_to_yaml(source.parent / relative)
        if elsewhere is not None:
            result.diagnostics.append(_err(
                doc.path, item_at, "import-invalid", f'imported file "{relative}" is not a YAML file '
                f'(it is {elsewhere[-80:]!r})', "an import names a .yaml or .yml file of gates, models and tools"))
            continue
        library = cache.libraries.get(file)
        if library is None:
            frame = _Frame(file, shown, (doc.path, *item_at))
            library = _load_library(file, shown, cache, chain + (frame,))
            if not any(d.rule == "import-cycle" for d in library.diagnostics):
                cache.libraries[file] = library
        result.diagnostics.extend(library.diagnostics)
        result.files.extend([file, *library.files])
        _merge(result, library, alias, doc.path, item_at, relative)
    return result


def _merge(into: ImportResult, library: ImportResult, alias: str | None,
           importer: str, item_at: tuple[int, int], relative: str) -> None:
    tables = (("gate", library.gates, into.gates), ("model", library.models, into.models),
              ("tool", library.tools, into.tools))
    for kind, table, target in tables:
        for name, thing in table.items():
            full = (f"{alias}__" if kind == "tool" else f"{alias}.") + name if alias else name
            origin = library.origins.get((kind, name), (relative, 1, 1))
            if full in target and into.origins.get((kind, full)) == origin:
                continue  # the same definition again (a diamond: two imports of one shared file)
            if full in target:
                first = into.origins.get((kind, full), (importer, 1, 1))
                into.diagnostics.append(_err(
                    importer, item_at, "import-clash",
                    f'{kind} "{full}" from "{relative}" clashes with another {kind} of that name',
                    f'import one of the files with `{{path: {relative}, as: NAME}}` to use its names as NAME.{name}',
                    ((first[0], first[1], first[2], f'first {kind} "{full}" is defined here'),
                     (origin[0], origin[1], origin[2], f'second {kind} "{full}" is defined here'))))
                continue
            if alias and kind == "gate" and thing.ref in library.gates:  # type: ignore[union-attr]
                # A reference to a gate of the same library follows it under the prefix.
                thing = replace(thing, ref=f"{alias}.{thing.ref}")  # type: ignore[union-attr]
            target[full] = thing  # type: ignore[assignment]
            into.origins[(kind, full)] = origin


def local_clashes(doc: Document, imported: ImportResult) -> list[Diagnostic]:
    """A loop's own gates/models that have the same name as imported ones."""
    out = []
    data = doc.data if isinstance(doc.data, dict) else {}
    for kind, section in (("gate", "gates"), ("model", "models"), ("tool", "tools")):
        table = {"gate": imported.gates, "model": imported.models, "tool": imported.tools}[kind]
        defined = data.get(section)
        for name in defined if isinstance(defined, dict) else ():
            if name in table:
                origin = imported.origins.get((kind, name), (doc.path, 1, 1))
                out.append(_err(
                    doc.path, doc.locate((section, name)), "import-clash",
                    f'{kind} "{name}" is defined here and also imported',
                    "rename one of them, or import the file with `as:` so its names get a prefix",
                    ((origin[0], origin[1], origin[2], f'imported {kind} "{name}" is defined here'),)))
    return out


def _load_library(file: Path, shown: str, cache: ImportCache, chain: tuple[_Frame, ...]) -> ImportResult:
    try:
        raw = read_capped(file)
    except OSError as exc:
        return ImportResult(diagnostics=[_err(shown, (0, 0), "missing-file",
                                              f"cannot read imported file: {exc.strerror or exc}", "")])
    doc, problems = load_document(shown, raw)
    if doc is None:
        return ImportResult(diagnostics=problems)
    return lint_library(doc, file, cache=cache, _chain=chain)


def _bad(doc: Document, path: YamlPath, message: str, hint: str, *, value: bool = False) -> Diagnostic:
    return _err(doc.path, doc.locate(path, value=value), "import-invalid", message, hint)


_LIBRARY_HINT = (
    'a gate is {shell: CMD}, {expr: EXPR}, {json_schema: {...}}, {builtin: python_syntax|no_secrets} '
    "or {ref: NAME}; a model alias is {model: provider/name, max_tokens: N, ...} (see docs/dsl.md)"
)


@lru_cache(maxsize=1)
def _library_validator() -> Any:
    """The loop schema's own definitions of gates and models, applied to a library file."""
    from .user_schema import validator_class
    from .schema import load_schema

    loop_schema = load_schema()
    library: dict[str, Any] = {k: loop_schema[k] for k in ("$schema", "definitions") if k in loop_schema}
    library.update(
        type="object",
        additionalProperties=False,
        properties={k: loop_schema["properties"][k] for k in LIBRARY_KEYS if k in loop_schema["properties"]},
    )
    return validator_class()(library)


def _schema_problems(doc: Document) -> tuple[list[Diagnostic], set[YamlPath]]:
    """import-invalid findings (one per node) and the paths of the entries they concern."""
    from jsonschema.exceptions import best_match

    found: dict[YamlPath, Diagnostic] = {}
    for error in _library_validator().iter_errors(doc.data):
        worst = best_match([error])
        path: YamlPath = tuple(worst.absolute_path)
        if error.validator == "additionalProperties" and not path:
            for key in doc.data:
                if key not in LIBRARY_KEYS:
                    hint = ("an imported file brings only `gates` and `models`; a loop with states is run "
                            "with `loop: PATH` instead") if key in ("states", "start", "name") else \
                        f"allowed keys: {', '.join(LIBRARY_KEYS)}"
                    found.setdefault((key,), _bad(doc, (key,), f'unexpected key "{key}" in an imported file', hint))
            continue
        if error.validator == "propertyNames" or worst.validator == "pattern" and len(path) == 1:
            bad_name = worst.instance
            path = tuple(error.absolute_path) + (bad_name,)
            found.setdefault(path, _bad(doc, path, f'name "{bad_name}" must match {worst.validator_value}',
                                        "use lowercase letters, digits and '_' (gate names may also use '-')"))
            continue
        where = ".".join(str(p) for p in path) or "the file"
        if worst.validator in ("oneOf", "anyOf"):
            noun = {"gates": "gate", "models": "model alias", "imports": "import"}.get(str(path[0]), "value") \
                if path else "value"
            message = f"`{where}` is not a valid {noun}"
        elif worst.validator == "required":
            missing = [k for k in worst.validator_value if k not in (worst.instance or {})]
            message = f"`{where}` is missing the required key `{missing[0] if missing else '?'}`"
        else:
            message = f"`{where}`: {worst.message}"
        found.setdefault(path, _bad(doc, path, message, _LIBRARY_HINT, value=bool(path)))
    return list(found.values()), set(found)


def lint_library(doc: Document, source: Path, *, cache: ImportCache | None = None,
                 _chain: tuple[_Frame, ...] = ()) -> ImportResult:
    """Check a library file and build its gates and models (its own imports included)."""
    data = doc.data
    problems, broken = _schema_problems(doc)
    result = resolve_imports(doc, source, cache=cache, _chain=_chain)
    result.diagnostics.extend(problems)
    result.diagnostics.extend(local_clashes(doc, result))

    def usable(section: str, name: str) -> bool:
        return not any(p[:2] == (section, name) or p == (section,) for p in broken)

    gates = data.get("gates")
    for name, raw in (gates.items() if isinstance(gates, dict) else ()):
        if usable("gates", name):
            result.gates[name] = build_gate(raw, ("gates", name), name=name)
            result.origins[("gate", name)] = (doc.path, *doc.locate(("gates", name)))
    tools = data.get("tools")
    for name, raw in (tools.items() if isinstance(tools, dict) else ()):
        if usable("tools", name) and isinstance(raw, dict):
            result.tools[name] = build_tool(name, raw)
            result.origins[("tool", name)] = (doc.path, *doc.locate(("tools", name)))
    models = data.get("models")
    for name, raw in (models.items() if isinstance(models, dict) else ()):
        if usable("models", name):
            alias = build_model_alias(name, raw, ("models", name))
            result.models[name] = alias
            result.origins[("model", name)] = (doc.path, *doc.locate(("models", name)))
            result.diagnostics.extend(_price_problems(doc, name, alias))
            result.diagnostics.extend(_params_problems(doc, alias))
    return result


def _params_problems(doc: Document, alias: ModelAlias) -> list[Diagnostic]:
    return params_cost_diagnostics(doc.path, lambda path: doc.locate(path), alias)


def _price_problems(doc: Document, name: str, alias: ModelAlias) -> list[Diagnostic]:
    if alias.price is not None:
        return []
    out = []
    for model, path in [(alias.model, ("models", name, "model"))] + [
        (f, ("models", name, "fallbacks", i)) for i, f in enumerate(alias.fallbacks)
    ]:
        found = price_diagnostic(doc.path, doc.locate(path, value=True), name, model)
        if found is not None:
            out.append(found)
    return out


def is_library(data: Any) -> bool:
    """A YAML mapping that is an import library rather than a loop."""
    return isinstance(data, dict) and not ({"states", "start", "name"} & set(data)) and bool(
        {"gates", "models", "tools"} & set(data))
