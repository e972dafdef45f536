"""Values that travel: variables that carry a placeholder's value through a shell command.

`x={{ v }}; (( x ))` evaluates the value as surely as `(( {{ v }} ))`, so the variables a value
reaches (by assignment, `read`, `for`, a function's `$1`, `bash -c '...' _ {{ v }}`, or a word
naming one, since arithmetic reads names recursively) are tainted, and each place they are
read is judged like a placeholder (shell_parse.py). Whole-script hazards are found here too:
a shell reading its input as code, a file written and then run, alias expansion, PS4.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .shell_commands import SHELLS, Word, command_hazards, unwrap
from .shell_parse import (
    IDENTIFIER,
    IDENTIFIER_IN,
    Place,
    Script,
    assignment_place,
    classify,
    command_words,
    dangerous_variable,
    declaration_flags,
    first_error,
    in_arithmetic,
    walk,
)

_POSITIONAL = ("@", "*", "1", "2", "3", "4", "5", "6", "7", "8", "9")
_READERS = frozenset({"read", "mapfile", "readarray", "printf", "getopts", "wait"})


@dataclass
class Analysis:
    places: list[Place] = field(default_factory=list)
    # (byte offset, kind, context, variable) for variables that carry a value into a bad place
    carried: list[tuple[int, str, str, str]] = field(default_factory=list)
    syntax_error: int | None = None          # byte offset of the first thing bash cannot parse
    hazards: list[tuple[int, str]] = field(default_factory=list)
    # (byte offset, context, variable): a carried value a program may read as an option
    carried_options: list[tuple[int, str, str]] = field(default_factory=list)


_DECLARERS = frozenset({"declare", "typeset", "local", "export", "readonly"})


def _collect_declarations(script: Script) -> None:
    """Names declared integer (`-i`) or nameref (`-n`) anywhere: assigning them evaluates.
    tree-sitter reads `! declare ...` and `builtin declare ...` as plain commands, so those
    count too."""
    for node in walk(script.root):
        if node.type == "declaration_command":
            flags = declaration_flags(script, node)
            texts = [script.text(c.children[0]) if c.type == "variable_assignment" and c.children
                     else script.text(c) for c in node.children
                     if c.type in ("variable_assignment", "word", "variable_name")]
        elif node.type == "command":
            words, _nodes = command_words(script, node)
            start, _wrappers = unwrap(words)
            if start >= len(words) or words[start].literal not in _DECLARERS:
                continue
            literals = [w.literal or "" for w in words[start + 1:]]
            flags = "".join(w[1:] for w in literals if w.startswith("-"))
            texts = [w.split("=", 1)[0] for w in literals if not w.startswith("-")]
        else:
            continue
        for name in (t for t in texts if IDENTIFIER.match(t)):
            if "i" in flags:
                script.integer_names.add(name)
            if "n" in flags:
                script.nameref_names.add(name)


def _collect_taint(script: Script) -> None:
    """Variables that carry a value: assigned from one, read into, looped over (fixpoint)."""
    tainted = script.tainted
    script.functions = {script.text(n.child_by_field_name("name")) for n in walk(script.root)
                        if n.type == "function_definition" and n.child_by_field_name("name")}
    if script.positional:
        tainted.update(_POSITIONAL)
    changed = True
    while changed:
        changed = False
        for node in walk(script.root):
            names: list[str] = []
            if node.type == "variable_assignment" and node.children:
                target = node.children[0]
                if target.type == "subscript" and target.children:
                    target = target.children[0]
                if any(script.carries(c) for c in node.children[1:]):
                    names.append(script.text(target))
            elif node.type == "for_statement":
                variable = node.child_by_field_name("variable")
                if variable is not None and any(script.carries(c) for c in node.children):
                    names.append(script.text(variable))
            elif node.type == "command":
                names.extend(_command_taints(script, node))
            elif node.type == "variable_name" and script.text(node).startswith("LOOPDSL_"):
                names.append(script.text(node))
            for name in names:
                if name not in tainted:
                    tainted.add(name)
                    changed = True


def _command_taints(script: Script, command: Any) -> list[str]:
    """Names a command fills with a value: `read x` fed by one, `f "$v"` (f's $1), `set -- "$v"`."""
    name_node = command.child_by_field_name("name")
    if name_node is None:
        return []
    name = script.text(name_node)
    arguments = [c for c in command.children if c.id != name_node.id]
    if name in _READERS and (any(script.carries(c) for c in arguments) or _input_carries(script, command)):
        return [script.text(c) for c in arguments if IDENTIFIER.match(script.text(c))] + ["REPLY", "MAPFILE"]
    if (name in script.functions or name == "set") and any(script.carries(c) for c in arguments):
        return list(_POSITIONAL)
    return []


def _input_carries(script: Script, command: Any) -> bool:
    """Whether what `command` reads on standard input may hold a value: a redirection of it or
    of a loop around it (`while read x; do ...; done < <(...)`), an earlier stage of a pipeline
    it is part of, or a here-string. Inside a function its input is the caller's: assume so."""
    node = command
    while node.parent is not None:
        parent = node.parent
        if parent.type == "redirected_statement" and any(
                script.carries(c) for c in parent.children if c.id != node.id):
            return True
        if parent.type == "pipeline" and any(
                script.carries(c) for c in parent.children if c.end_byte <= node.start_byte):
            return True
        if parent.type == "function_definition":
            return True
        node = parent
    return False


def analyze(data: bytes, spans: list[tuple[int, int]], integer: list[bool] | None = None,
            positional: bool = False, inherited: frozenset[str] = frozenset()) -> Analysis:
    """The place of each sentinel (byte spans in `data`) and every hazard in the script.
    `integer[i]`: value i is proven an integer; `positional`: $1... carry values;
    `inherited`: variables that carry one from an outer script (`x=$v bash -c '...'`)."""
    carrying = [span for i, span in enumerate(spans) if not (integer and integer[i])]
    script = Script(data, spans, carrying, positional)
    script.tainted.update(inherited)
    script.inherited = inherited
    analysis = Analysis()
    analysis.syntax_error = first_error(script)
    if not spans and not positional and not inherited:
        return analysis
    _collect_declarations(script)
    _collect_taint(script)
    for start, end in spans:
        node = script.root.descendant_for_byte_range(start, end)
        analysis.places.append(classify(script, node, start))
    for node in walk(script.root):
        _check_carried(script, node, analysis)
    _check_script_hazards(script, analysis)
    return analysis


def _check_carried(script: Script, node: Any, analysis: Analysis) -> None:
    """Variables that carry a value into a place where bash evaluates it, and commands that
    turn their input into code."""
    if node.type in ("simple_expansion", "expansion"):
        carried = script.references(node) & script.tainted
        if carried and node.type == "expansion" and any(c.type == "!" for c in node.children[:2]):
            analysis.carried.append((node.start_byte, "name", "${!name}, which reads the variable "
                                     "the value names", sorted(carried)[0]))
        elif carried and node.type == "expansion" and script.text(node).endswith("@P}"):
            analysis.carried.append((node.start_byte, "code", "${name@P}, which expands the value "
                                     "as a prompt (running its $( ))", sorted(carried)[0]))
        elif carried:
            place = classify(script, node, node.start_byte)
            if place.kind == "option":
                analysis.carried_options.append((node.start_byte, place.context, sorted(carried)[0]))
            elif place.kind not in ("ok", "single", "heredoc", "backtick"):
                named = sorted(n for n in carried if not n.isdigit() and n not in ("@", "*"))
                shown = (named or sorted(carried))[0]
                analysis.carried.append((node.start_byte, place.kind, place.context, shown))
    elif node.type in ("variable_name", "word") and IDENTIFIER.match(script.text(node)):
        name = script.text(node)
        if name in script.tainted and in_arithmetic(node):
            analysis.carried.append((node.start_byte, "integer", "an arithmetic expression", name))
    elif node.type == "array":
        for element in node.children:
            text = script.text(element)
            if text.startswith("[") and "]=" in text:
                names = set(IDENTIFIER_IN.findall(text[1:text.index("]=")])) & script.tainted
                if names:
                    analysis.carried.append((element.start_byte, "integer", "an array index, "
                                             "which bash evaluates as arithmetic", sorted(names)[0]))
    elif node.type == "variable_assignment" and len(node.children) > 2:
        place = assignment_place(script, node, False)
        names = set(IDENTIFIER_IN.findall(script.text(node.children[-1]))) & script.tainted
        if place.kind in ("integer", "name") and names:
            analysis.carried.append((node.start_byte, place.kind, place.context, sorted(names)[0]))
    elif node.type == "command":
        words, nodes = command_words(script, node)
        start, _wrappers = unwrap(words)
        if start < len(words) and words[start].literal == "let":
            names = {n for w in words[start + 1:] for n in IDENTIFIER_IN.findall(w.literal or "")}
            if names & script.tainted:
                analysis.carried.append((node.start_byte, "integer", "an argument of `let`",
                                         sorted(names & script.tainted)[0]))
        hazard = command_hazards(words)
        if hazard is not None and (script.carrying or script.positional):
            analysis.hazards.append((node.start_byte, hazard.context))
        _check_inner_script(script, node, words, nodes, analysis)
    elif node.type == "declaration_command":
        flags = declaration_flags(script, node)
        if "i" in flags or "n" in flags:
            for child in node.children:
                if child.type in ("word", "variable_name") and script.text(child) in script.tainted:
                    analysis.carried.append((child.start_byte, "name", "`declare -i` or `-n` of "
                                             "a variable", script.text(child)))


def _check_script_hazards(script: Script, analysis: Analysis) -> None:
    """Whole-script settings that make a value run: a carried value in PS4 or PATH, and alias
    expansion (off in scripts unless `shopt -s expand_aliases` or `set -o posix` turns it on;
    then `alias x=eval` makes `x "$v"` run the value)."""
    assigned_directly = {script.text(n.children[0]) for n in walk(script.root)
                         if n.type == "variable_assignment" and n.children and
                         any(script.holds_sentinel(c) for c in n.children[1:])}
    reported = assigned_directly | script.inherited      # the outer script or `env:` reports those
    for name in sorted(n for n in script.tainted if dangerous_variable(n) and n not in reported):
        analysis.carried.append((0, "code", f"`{name}`, which decides what a program runs", name))
    for node in walk(script.root):
        if node.type != "command":
            continue
        words = [script.text(c) for c in node.children if c.is_named]
        if words and words[0] in ("shopt", "set") and any(
                w in ("expand_aliases", "posix") for w in words[1:]):
            analysis.hazards.append((node.start_byte, f"`{' '.join(words)[:40]}` turns on alias "
                                     "expansion, which lets an alias run a value as code"))
        elif any(c.type == "variable_assignment" and script.text(c).startswith("POSIXLY_CORRECT=")
                 for c in node.children):
            analysis.hazards.append((node.start_byte, "POSIXLY_CORRECT turns on alias expansion"))


def _inner_script(words: list[Word], script: Script) -> tuple[int, str, str, bool] | None:
    """The literal code a command runs: (its word index, the code, who runs it, whether its
    $1... carry values). `bash -c 'CODE' _ "$v"`, `eval 'CODE'`, `trap 'CODE' EXIT`."""
    start, _wrappers = unwrap(words)
    if start >= len(words) or words[start].literal is None:
        return None
    name = words[start].literal.rsplit("/", 1)[-1]
    inherited_positional = "1" in script.tainted
    if name in ("eval", "trap") and len(words) > start + 1:
        code = words[start + 1:] if name == "eval" else words[start + 1:start + 2]
        if all(w.literal is not None for w in code):
            return start + 1, " ".join(w.literal or "" for w in code), name, inherited_positional
        return None
    if name not in SHELLS:
        return None
    flags = [w.literal or "" for w in words[start + 1:] if (w.literal or "").startswith("-")]
    if not any(f.startswith("-") and not f.startswith("--") and "c" in f for f in flags):
        return None
    operands = [i for i in range(start + 1, len(words)) if not (words[i].literal or "").startswith("-")]
    if not operands or words[operands[0]].literal is None:
        return None
    positional = any(w.tainted for w in words[operands[0] + 1:])
    return operands[0], words[operands[0]].literal or "", f"{name} -c", positional


def _check_inner_script(script: Script, command: Any, words: list[Word], nodes: list[Any],
                        analysis: Analysis) -> None:
    """Read the literal code a command runs (`bash -c 'echo $(( $1 ))' _ "$v"`, `eval '...'`)
    with the outer script's carrying variables, and $1... when values are passed to it."""
    found = _inner_script(words, script)
    if found is None:
        return
    index, code, runner, positional = found
    inherited = frozenset(n for n in script.tainted if not n.isdigit() and n not in ("@", "*"))
    inner = analyze(code.encode("utf-8", "surrogateescape"), [], positional=positional,
                    inherited=inherited)
    at = nodes[index].start_byte
    for _byte, kind, context, variable in inner.carried:
        analysis.carried.append((at, kind, f"{context} in the code of `{runner}`", variable))
    if inner.syntax_error is not None and analysis.syntax_error is None:
        analysis.syntax_error = at      # the inner script's places cannot be trusted either
    for _byte, context in inner.hazards:
        analysis.hazards.append((at, context))
    for _byte, context, variable in inner.carried_options:
        analysis.carried_options.append((at, f"{context} in the code of `{runner}`", variable))
