"""Where each value stands in a shell command, read by a real bash parser (tree-sitter-bash).

shell_template.py replaces every `{{ }}` with a sentinel word and hands the script here. The
rule is an allow-list: a value may stand only where bash uses it as plain data (an argument
of a simple command that does not run or evaluate it, an assignment's value, a file name of
a redirection, a string operand of `[[ == != =~ -z -n ]]`, a `case` subject or pattern). In an
arithmetic or name context only a value proven to be an integer may stand. Anything else is
refused with the context named. shell_flow.py follows the variables that carry a value.

tree-sitter is imported on first use, so only the paths that compile a command pay for it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

from .shell_commands import Judgement, Word, judge_argument

# Variables whose value bash later runs or uses to choose what runs.
DANGEROUS_VARIABLES = frozenset({
    "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "BASH_ENV", "ENV", "PATH", "LD_PRELOAD",
    "LD_LIBRARY_PATH", "LD_AUDIT", "SHELLOPTS", "BASHOPTS", "BASH_LOADABLES_PATH", "IFS",
    "GIT_SSH_COMMAND", "GIT_SSH", "GIT_EXTERNAL_DIFF", "GIT_PROXY_COMMAND", "GIT_EXEC_PATH",
    "GIT_ASKPASS", "SSH_ASKPASS", "SUDO_ASKPASS", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR",
    "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT", "PAGER", "GIT_PAGER", "MANPAGER", "EDITOR",
    "VISUAL", "BROWSER", "LESSOPEN", "LESSCLOSE", "PERL5OPT", "PERL5LIB", "NODE_OPTIONS",
    "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "RUBYOPT", "RUBYLIB", "DYLD_INSERT_LIBRARIES",
})
# Prefixes of variables that configure what programs run (`GIT_CONFIG_KEY_0=core.pager`).
_DANGEROUS_PREFIXES = ("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_", "BASH_FUNC_")


def dangerous_variable(name: str) -> bool:
    return name in DANGEROUS_VARIABLES or name.startswith(_DANGEROUS_PREFIXES)
_VALUE_OPS = frozenset({":-", "-", ":=", "=", ":+", "+", ":?", "?"})
_PATTERN_OPS = frozenset({"#", "##", "%", "%%", "/", "//", "/#", "/%", "^", "^^", ",", ",,"})
_STRING_TEST_OPS = frozenset({"==", "=", "!=", "=~", "<", ">", "-nt", "-ot", "-ef", "&&", "||",
                              "-a", "-o"})
_INTEGER_TEST_OPS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
_EXPRESSIONS = frozenset({"binary_expression", "unary_expression", "parenthesized_expression",
                          "ternary_expression", "postfix_expression", "negated_expression"})
_HEREDOC = frozenset({"heredoc_body", "heredoc_content", "heredoc_start", "heredoc_end",
                      "heredoc_redirect"})
_REDIRECTS = frozenset({"file_redirect", "herestring_redirect", "heredoc_redirect"})
_RESERVED_WORDS = frozenset({"if", "then", "else", "elif", "fi", "case", "esac", "for", "select",
                             "while", "until", "do", "done", "in", "function", "{", "}", "!",
                             "[[", "]]"})
# Nodes that end the search for an enclosing arithmetic context (a name inside them is text).
_ARITHMETIC_STOPS = frozenset({"command", "do_group", "string", "command_substitution",
                               "process_substitution", "program", "test_command", "expansion",
                               "declaration_command", "heredoc_body", "raw_string", "array"})
IDENTIFIER_IN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Place:
    """Where one value stands: a verdict from the allow-list and how to quote it."""

    kind: str            # ok integer name code command option single heredoc backtick place
    context: str
    in_double_quotes: bool = False


@lru_cache(maxsize=1)
def _parser() -> Any:
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def walk(node: Any) -> Iterator[Any]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


class Script:
    def __init__(self, data: bytes, spans: list[tuple[int, int]],
                 carrying: list[tuple[int, int]] | None = None, positional: bool = False) -> None:
        self.data = data
        self.spans = spans
        # Spans of the values that carry taint (a proven integer cannot smuggle code).
        self.carrying = spans if carrying is None else carrying
        self.positional = positional     # $1, $@ ... hold values (the script of `bash -c`)
        self.functions: set[str] = set()
        self.inherited: frozenset[str] = frozenset()
        self.tree = _parser().parse(data)
        self.root = self.tree.root_node
        self.integer_names: set[str] = set()
        self.nameref_names: set[str] = set()
        self.tainted: set[str] = set()

    def text(self, node: Any) -> str:
        return self.data[node.start_byte:node.end_byte].decode("utf-8", "surrogateescape")

    def holds_sentinel(self, node: Any) -> bool:
        return any(node.start_byte <= s and e <= node.end_byte for s, e in self.spans)

    def references(self, node: Any) -> set[str]:
        """Variables an expansion inside `node` reads (`$x`, `${x...}`, `${!x}`)."""
        names = set()
        for sub in walk(node):
            if sub.type in ("simple_expansion", "expansion"):
                for child in sub.children:
                    if child.type in ("variable_name", "special_variable_name"):
                        names.add(self.text(child))
                    elif child.type == "subscript" and child.children:
                        names.add(self.text(child.children[0]))
        return names

    def carries(self, node: Any) -> bool:
        """Holds a value, reads a variable that does, or names one: arithmetic reads a name's
        value as an expression, so `y=x; (( y ))` evaluates what x holds."""
        holds = any(node.start_byte <= s and e <= node.end_byte for s, e in self.carrying)
        if holds or self.references(node) & self.tainted:
            return True
        return any(sub.type in ("word", "variable_name", "raw_string", "string_content")
                   and self.text(sub).strip("'\"") in self.tainted for sub in walk(node))


def declaration_flags(script: Script, declaration: Any) -> str:
    return "".join(script.text(c)[1:] for c in declaration.children
                   if c.type == "word" and script.text(c).startswith("-"))


def first_error(script: Script) -> int | None:
    """Where the parser failed, or misread the script: tree-sitter-bash reads `! for ...` as a
    command named `for` (bash never runs an unquoted reserved word as a command) and
    `! (( x ))` as two subshells (bash reads `((` as arithmetic wherever it can). Either way
    the places it found cannot be trusted, so the command is refused."""
    for node in walk(script.root):
        if node.is_error or node.is_missing:
            return int(node.start_byte)
        if node.type == "command_name" and script.text(node) in _RESERVED_WORDS:
            return int(node.start_byte)
        if (node.type == "subshell" and script.text(node).startswith("((")) or (
                node.type == "command_substitution" and script.text(node).startswith("$((")):
            return int(node.start_byte)
    return None


def in_arithmetic(node: Any) -> bool:
    """A bare name inside `$(( ))`, `(( ))`, `for ((;;))`, `[[ n -eq 1 ]]`, an array index or
    the offset of `${s:n}`: bash reads the variable's value as an arithmetic expression."""
    parent = node.parent
    if parent is None:
        return False
    if parent.type == "subscript":
        return parent.children[0].id != node.id or in_arithmetic(parent)
    if parent.type == "expansion":
        return expansion_role(parent, node) == "integer"
    if parent.type == "variable_assignment" and parent.children[0].id != node.id and \
            _in_for_header(parent):
        return True
    if parent.type in _EXPRESSIONS and _expression_container(node) is not None and \
            _expression_container(node).type == "test_command":
        container = _expression_container(node)
        operator = parent.child_by_field_name("operator")
        return operator is not None and container.children[0].type == "[[" and \
            _operator_text(operator) in _INTEGER_TEST_OPS
    current = parent
    while current is not None and current.type not in _ARITHMETIC_STOPS:
        if current.type in ("arithmetic_expansion", "c_style_for_statement") or (
                current.type == "compound_statement" and current.children and
                current.children[0].type == "(("):
            return True
        current = current.parent
    return False


def _in_for_header(assignment: Any) -> bool:
    """An assignment inside `for (( ))` (its value is arithmetic)."""
    return assignment.parent is not None and assignment.parent.type == "c_style_for_statement"


def _operator_text(node: Any) -> str:
    return node.text.decode("utf-8", "replace") if node is not None and node.text else ""


def _expression_container(node: Any) -> Any:
    current = node.parent
    while current is not None and current.type in _EXPRESSIONS:
        current = current.parent
    if current is None:
        return None
    if current.type in ("test_command", "arithmetic_expansion", "c_style_for_statement", "subscript"):
        return current
    if current.type == "compound_statement" and current.children and current.children[0].type == "((":
        return current
    if current.type == "variable_assignment" and current.parent is not None and \
            current.parent.type == "c_style_for_statement":
        return current.parent
    return None


def command_words(script: Script, command: Any) -> tuple[list[Word], list[Any]]:
    nodes = [c for c in command.children
             if c.type not in _REDIRECTS and c.type not in ("variable_assignment", "comment")
             and c.is_named]
    if nodes and nodes[0].type == "command_name":
        nodes[0] = nodes[0].children[0] if nodes[0].children else nodes[0]
    return [Word(_literal(script, n), script.carries(n), n.type == "process_substitution")
            for n in nodes], nodes


def _literal(script: Script, node: Any) -> str | None:
    if script.holds_sentinel(node):
        return None
    if node.type in ("word", "number"):
        return re.sub(r"\\(.)", r"\1", script.text(node))
    if node.type == "raw_string":
        return script.text(node)[1:-1]
    if node.type == "string" and all(c.type == "string_content" or not c.is_named for c in node.children):
        return script.text(node)[1:-1]
    if node.type == "concatenation":
        parts = [_literal(script, c) for c in node.children]
        return None if any(p is None for p in parts) else "".join(p or "" for p in parts)
    return None


def classify(script: Script, node: Any, value_start: int) -> Place:
    """Walk up from where a value stands to the construct that decides what bash does with it."""
    ancestor = node
    while ancestor is not None:    # quoting that holds the whole value, however deep
        if ancestor.type == "command_substitution" and ancestor.children and \
                ancestor.children[0].type == "`":
            return Place("backtick", "inside backticks")
        if ancestor.type in _HEREDOC:
            return Place("heredoc", "inside a here-document")
        ancestor = ancestor.parent
    in_dq = False
    current = node
    while True:
        kind = current.type
        if kind in ("raw_string", "ansi_c_string"):
            return Place("single", "inside single quotes")
        if kind in _HEREDOC:
            return Place("heredoc", "inside a here-document")
        if kind == "comment":
            return Place("ok", "a comment")
        if kind == "command_substitution" and current.children and current.children[0].type == "`":
            return Place("backtick", "inside backticks")
        parent = current.parent
        if parent is None or kind == "ERROR":
            return Place("place", "a part of the command bash cannot parse")
        ptype = parent.type
        if ptype in ("concatenation", "string", "string_content"):
            in_dq = in_dq or ptype == "string"
            current = parent
            continue
        if ptype == "expansion":
            role = expansion_role(parent, current)
            if role in ("value", "pattern"):
                in_dq = in_dq and role == "value"
                current = parent
                continue
            return Place(role, "the name, index, offset or length of ${...}")
        if ptype == "array":
            element = script.text(current)
            if element.startswith("[") and current.start_byte + max(element.find("]="), 0) > value_start:
                return Place("integer", "an array index, which bash evaluates as arithmetic")
            current = parent
            continue
        return _decide(script, parent, current, value_start, in_dq)


def expansion_role(expansion: Any, child: Any) -> str:
    operator = None
    for sibling in expansion.children:
        if sibling.start_byte >= child.start_byte:
            break
        if not sibling.is_named and sibling.type not in ("${", "!", "#"):
            operator = sibling.type
    if operator in _VALUE_OPS:
        return "value"
    if operator in _PATTERN_OPS:
        return "pattern"
    if operator == ":":
        return "integer"
    return "name"


def _decide(script: Script, parent: Any, current: Any, value_start: int, in_dq: bool) -> Place:
    ptype = parent.type
    if ptype == "command_name":
        return Place("command", "the name of the command to run")
    if ptype == "command":
        words, nodes = command_words(script, parent)
        index = next((i for i, n in enumerate(nodes) if n.id == current.id), None)
        if index is None:
            return Place("ok", "an environment assignment", in_dq)
        judged: Judgement = judge_argument(words, index)
        starts_word = value_start <= current.start_byte + 1
        if judged.verdict in ("option", "leading-code") and not starts_word:
            return Place("ok", judged.context, in_dq)
        kind = "code" if judged.verdict == "leading-code" else judged.verdict
        return Place(kind, judged.context, in_dq)
    if ptype in ("file_redirect", "herestring_redirect"):
        return Place("ok", "a redirection", in_dq)
    if ptype == "variable_assignment":
        if parent.children and parent.children[0].id == current.id:
            return Place("name", "the name of a variable being assigned")
        return assignment_place(script, parent, in_dq)
    if ptype == "subscript":
        return Place("integer", "an array index, which bash evaluates as arithmetic")
    if ptype in ("declaration_command", "unset_command"):
        return Place("name", f"a name given to `{script.text(parent).split()[0]}`")
    if ptype == "test_command":
        return Place("ok", "an operand of [[ ]]", in_dq)
    if ptype in _EXPRESSIONS or ptype in ("arithmetic_expansion", "c_style_for_statement") or (
            ptype == "compound_statement" and parent.children[0].type == "(("):
        return _expression(script, parent, in_dq)
    if ptype == "for_statement":
        if parent.child_by_field_name("variable") is not None and \
                parent.child_by_field_name("variable").id == current.id:
            return Place("name", "the variable of a `for` loop")
        return Place("ok", "a word of a `for` list", in_dq)
    if ptype in ("case_statement", "case_item"):
        return Place("ok", "a `case` word", in_dq)
    return Place("place", f"a {ptype.replace('_', ' ')}")


def assignment_place(script: Script, assignment: Any, in_dq: bool) -> Place:
    target = assignment.children[0]
    if target.type == "subscript" and target.children:
        target = target.children[0]
    name = script.text(target)
    flags = declaration_flags(script, assignment.parent) if assignment.parent.type == "declaration_command" else ""
    if "n" in flags or name in script.nameref_names:
        return Place("name", f"the value of nameref `{name}`, a variable name")
    if "i" in flags or name in script.integer_names:
        return Place("integer", f"the value of integer variable `{name}`, which bash evaluates")
    if dangerous_variable(name):
        return Place("code", f"the value of `{name}`, which decides what a program runs")
    if assignment.parent.type == "c_style_for_statement":
        return Place("integer", "an arithmetic `for` loop")
    return Place("ok", "the value of an assignment", in_dq)


def _expression(script: Script, expression: Any, in_dq: bool) -> Place:
    container = _expression_container(expression.children[0]) if expression.type in _EXPRESSIONS \
        else expression
    if container is None or container.type != "test_command":
        return Place("integer", "an arithmetic expression, which bash evaluates as code")
    double = container.children[0].type == "[["
    if expression.type == "binary_expression":
        operator = _operator_text(expression.child_by_field_name("operator"))
        if operator in _INTEGER_TEST_OPS:
            if double:
                return Place("integer", f"an operand of [[ {operator} ]], which bash evaluates as arithmetic")
            return Place("ok", f"an operand of [ {operator} ]", in_dq)
        if operator in _STRING_TEST_OPS:
            return Place("ok", f"an operand of [[ {operator} ]]", in_dq)
        return Place("place", f"an operand of `{operator}` in a test")
    if expression.type == "unary_expression":
        operator = _operator_text(expression.children[0])
        if operator in ("-v", "-R"):
            return Place("name", f"the operand of `{operator}`, a variable name bash evaluates")
        return Place("ok", f"an operand of `{operator}`", in_dq)
    return Place("ok", "an operand of a test", in_dq)
