#!/usr/bin/env python3
"""Fuzz the lint pipeline: no input may make `loopdsl lint` raise.

Generates mutated loop files (from tests/data/dsl_example.yaml and an embedded loop:
lines deleted / duplicated / swapped / re-indented, characters flipped, YAML special
characters, tags, anchors and aliases, deep nesting, random bytes, truncation, values
and keys swapped for other types or names, data-level edits dumped back to YAML, and
hostile structure: Jinja nested or chained around and far past the parser's recursion
limit, deep YAML in flow, block-sequence and indented styles, hundreds of chained states,
names ending in control characters, huge integers) plus random files, runs each through the whole lint pipeline in-process, and counts failures:
an exception escaping, a case running over --timeout, or a diagnostic that breaks the
contract (no rule id, negative line, output that cannot be printed as UTF-8).

    python bench/fuzz_lint.py [--cases N] [--seed S] [--jobs J] [--case I] [--out DIR]

Case I of seed S is always the same input, whatever --jobs, so `--case I` replays one.
Each failing input is written to DIR (default: <tmp>/loopdsl-fuzz) with its traceback.
Exit status: 0 no failure, 1 failures.
"""
from __future__ import annotations

import argparse
import io
import json
import random
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_PATH = REPO / "tests" / "data" / "dsl_example.yaml"

# A second seed that touches what DSL.md's example does not: set, loop, end outputs, argv
# shell, named/ref gates, json_schema gates, imports by bare path, unattended, concurrency.
EMBEDDED_LOOP = """\
loopdsl: 1
name: fuzz-seed
unattended: true
concurrency: {group: fuzz, on_conflict: skip}
inputs:
  target: {type: string, default: "src", enum: [src, tests]}
  limit: {type: number, minimum: 0, maximum: 10}
secrets: [API_TOKEN]
models:
  fast: {model: openai/gpt-4o-mini, max_tokens: 200, price: {input_per_mtok: 0.15, output_per_mtok: 0.6}}
budget: {tokens: 5000, cost_usd: 0.1, steps: 10, wall_time: 90s}
gates:
  lint-ok: {shell: "ruff check .", timeout: 1m}
outputs:
  summary: "{{ summarise.text }}"
start: prepare
states:
  prepare:
    set: {count: "inputs.limit * 2", label: "'x'"}
    next: scan
  scan:
    shell: {argv: [ls, "{{ inputs.target }}"], cwd: ".", timeout: 10s, ok_exit: [0, 1]}
    idempotent: true
    gates:
      after: [{ref: lint-ok}, {json_schema: {type: object}}, python_syntax, {expr: "scan.exit_code == 0"}]
    retry: {max_attempts: 2, on: [shell_exit, timeout]}
    on_failure: broken
    transitions:
      - {to: summarise, when: "scan.stdout | length > 0"}
      - {to: fan_out}
  fan_out:
    loop: ./child.yaml
    with: {item_name: "{{ item }}"}
    for_each: "prepare.label"
    concurrency: 2
    tolerate_failures: 1
    next: summarise
  summarise:
    llm: {model: fast, prompt: "Summarise {{ scan.stdout }}", output: text, system: "Be brief."}
    max_visits: 2
    on_exhausted: broken
    next: finished
  finished: {end: completed, output: {count: "{{ prepare.count }}"}}
  broken: {end: failed}
"""

SPECIAL_TOKENS = [
    ":", ": ", "-", "- ", "?", "? ", "[", "]", "{", "}", ",", "#", " #", "&", "*", "!", "|",
    ">", "'", '"', "%", "@", "`", "\t", "\n", "\r\n", "\r", "\\", "---\n", "...\n", "<<: ",
    "{{", "}}", "{%", "%}", "\u2028", "\u00a0", "\ufeff", "\x85", "\x07", "\x1b", "~",
    "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "%YAML 9.9\n", "!!", "&&", "**",
]
TAGS = [
    "!!python/object/apply:os.system ['echo pwned']", "!!python/name:os.system",
    "!!python/object/new:subprocess.check_output [[ls]]", "!foo", "!!str", "!!int",
    "!!float", "!!binary", "!!set", "!!omap", "!!map", "!!seq", "!!timestamp", "!",
    "!<tag:yaml.org,2002:str>", "!!null", "!!bool",
]
VALUES = [
    "[]", "{}", "null", "~", "true", "false", "0", "-1", "1e400", "-1e400", ".nan", ".inf",
    "-.inf", "0x10", "0o17", "0b101", "1_000", "2024-01-01", "2024-01-01T10:00:00Z",
    '"x"', "''", "[1, {a: b}]", "{x: [1, 2]}", "'{{ nope }}'", '"{{ inputs.repo }}"',
    '"{% for %}"', '"{{ (1).__class__ }}"', "x" * 300, "9" * 5000, "-0", "1.5",
    "|\n  block\n  text", ">-\n  folded", '"\\u0000"', '"\\ud800"', "yes", "no",
    "completed", "failed", "escalated", "done", "draft", "review", "*undefined_alias",
    "'30s'", "10m", "-5s", "1h30m", "abc s", "[a, b, c]", "[[[[[[[[]]]]]]]]",
    "/", "../../..", "/nonexistent/x.yaml", "./fuzz-self.yaml", "SKILL.md", "..",
]
KEYS = [
    "loopdsl", "name", "description", "schedule", "inputs", "secrets", "models", "budget",
    "workspace", "imports", "gates", "start", "states", "shell", "llm", "evaluate",
    "checkpoint", "set", "loop", "with", "end", "output", "outputs", "next", "transitions",
    "to", "when", "retry", "on_failure", "timeout", "max_visits", "on_exhausted", "model",
    "prompt", "skill", "schema", "max_tokens", "before", "after", "expr", "json_schema",
    "ref", "cmd", "argv", "cwd", "env", "ok_exit", "for_each", "concurrency", "price",
    "fallbacks", "unattended", "on_timeout", "choices", "criteria", "idempotent", "tokens",
    "cost_usd", "steps", "wall_time", "max_attempts", "backoff", "on", "type", "default",
    "inputs", "feedback", "run", "error", "item", "index", "history", "<<", "", "1", "true",
    "Bad-Name", "x.y", "a b", "__class__",
]
DEEP_FLOW = ["[" * n + "]" * n for n in (10, 63, 64, 65, 200, 5000)] + ["{a: " * 70 + "}" * 70]


# ------------------------------------------------------------------ inputs

def seed_texts() -> list[str]:
    """Valid loops the mutations start from."""
    texts = [EMBEDDED_LOOP]
    if EXAMPLE_PATH.exists():
        texts.append(EXAMPLE_PATH.read_text(encoding="utf-8"))
    for folder in (REPO / "loops", REPO / "tests" / "data" / "ok", REPO / "examples"):
        if folder.is_dir():
            for path in sorted(folder.rglob("*.yaml"))[:20]:
                try:
                    texts.append(path.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError):
                    pass
    return texts


def _lines(text: str) -> list[str]:
    return text.split("\n")


def delete_lines(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    start = rng.randrange(len(lines))
    del lines[start:start + rng.choice((1, 1, 1, 2, 5))]
    return "\n".join(lines)


def duplicate_line(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    index = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1) if rng.random() < 0.3 else index, lines[index])
    return "\n".join(lines)


def swap_lines(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[a], lines[b] = lines[b], lines[a]
    return "\n".join(lines)


def reindent(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    index = rng.randrange(len(lines))
    line = lines[index]
    if rng.random() < 0.5:
        lines[index] = " " * rng.choice((1, 2, 4)) + line
    else:
        lines[index] = line[rng.choice((1, 2, 4)):] if line.startswith(" ") else "\t" + line
    return "\n".join(lines)


def flip_chars(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.choice((1, 1, 2, 5, 20))):
        if not chars:
            break
        index = rng.randrange(len(chars))
        chars[index] = chr(rng.choice((rng.randrange(32, 127), rng.randrange(0, 0x3000))))
    return "".join(chars)


def insert_special(rng: random.Random, text: str) -> str:
    index = rng.randrange(len(text) + 1)
    return text[:index] + rng.choice(SPECIAL_TOKENS) + text[index:]


def _value_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the text after `key: ` on each line that has one."""
    spans, offset = [], 0
    for line in _lines(text):
        colon = line.find(": ")
        if colon >= 0 and not line.lstrip().startswith("#"):
            spans.append((offset + colon + 2, offset + len(line)))
        offset += len(line) + 1
    return spans


def add_tag(rng: random.Random, text: str) -> str:
    spans = _value_spans(text)
    if not spans:
        return insert_special(rng, text)
    start, _ = rng.choice(spans)
    return text[:start] + rng.choice(TAGS) + " " + text[start:]


def swap_value(rng: random.Random, text: str) -> str:
    spans = _value_spans(text)
    if not spans:
        return text + "\nx: " + rng.choice(VALUES)
    start, end = rng.choice(spans)
    return text[:start] + rng.choice(VALUES) + text[end:]


def swap_key(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    keyed = [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("#")]
    if not keyed:
        return text
    index = rng.choice(keyed)
    line = lines[index]
    indent = len(line) - len(line.lstrip(" -"))
    colon = line.find(":", indent)
    lines[index] = line[:indent] + rng.choice(KEYS) + line[colon:]
    return "\n".join(lines)


def anchors_aliases(rng: random.Random, text: str) -> str:
    choice = rng.randrange(5)
    if choice == 0:  # billion laughs appended
        levels = rng.randint(2, 12)
        bomb = ["lol0: &lol0 [a, a, a, a, a, a, a, a, a, a]"]
        bomb += [f"lol{n}: &lol{n} [" + ", ".join([f"*lol{n - 1}"] * 10) + "]"
                 for n in range(1, levels)]
        return text + "\n" + "\n".join(bomb) + "\n"
    if choice == 1:  # recursive alias
        return text + "\nrec: &rec [1, *rec]\n"
    if choice == 2:  # undefined alias as a value
        spans = _value_spans(text)
        if spans:
            start, end = rng.choice(spans)
            return text[:start] + "*nowhere" + text[end:]
        return text + "\nx: *nowhere\n"
    spans = _value_spans(text)
    if len(spans) < 2:
        return text
    (a_start, _), (b_start, b_end) = sorted(rng.sample(spans, 2))
    if choice == 3:  # anchor one value, alias it from a later one
        return text[:a_start] + "&anc " + text[a_start:b_start] + "*anc" + text[b_end:]
    # a merge key in place of a value
    return text[:b_start] + "{<<: *anc}" + text[b_end:] if "&anc" in text else \
        text[:a_start] + "&anc " + text[a_start:b_start] + "{<<: *anc, z: 1}" + text[b_end:]


def deep_nesting(rng: random.Random, text: str) -> str:
    spans = _value_spans(text)
    if rng.random() < 0.5 and spans:
        start, end = rng.choice(spans)
        return text[:start] + rng.choice(DEEP_FLOW) + text[end:]
    depth = rng.choice((30, 63, 64, 65, 100))
    block = "".join("  " * i + f"k{i}:\n" for i in range(depth))
    return text + "\n" + block


# Where templates and expressions live (block, quoted, plain or inside a flow mapping).
_TEMPLATE_SITE = re.compile(
    r"""\b(?:prompt|when|shell|cmd|expr|message|system|for_each): (?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|[|>][-+]?[ \t]*$|[^,}\n]+)""",
    re.MULTILINE)


def _replace_template(rng: random.Random, text: str, new: str) -> str | None:
    """`text` with one template or expression value replaced by `new` (None: none found)."""
    sites = list(_TEMPLATE_SITE.finditer(text))
    if not sites:
        return None
    site = rng.choice(sites)
    start, end = site.span("value")
    if site.group("value")[0] in "|>":  # a block scalar: drop its more-indented lines too
        line_start = text.rfind("\n", 0, start) + 1
        indent = len(text[line_start:start]) - len(text[line_start:start].lstrip())
        rest = text[end:].split("\n")[1:]
        kept = 0
        while kept < len(rest) and (not rest[kept].strip() or len(rest[kept]) - len(rest[kept].lstrip()) > indent):
            kept += 1
        end += sum(len(line) + 1 for line in rest[:kept])
    return text[:start] + json.dumps(new) + text[end:]


def _deep_jinja(rng: random.Random, huge: bool) -> str:
    """A template or expression nesting (or chaining) around the limits and far past them."""
    n = rng.choice((16, 17, 21, 31, 32, 33, 70, 99, 101, 2000, 100_000 if huge and rng.random() < 0.1 else 5000))
    kind = rng.randrange(9)
    if kind == 0:
        return "(" * n + "x" + ")" * n
    if kind == 1:
        return "{% if x %}" * n + "y" + "{% endif %}" * n
    if kind == 2:
        return "not " * n + "x"
    if kind == 3:
        return " + ".join(["1"] * n)
    if kind == 4:
        return "{{ x" + " | upper" * n + " }}"
    if kind == 5:
        return "x" + ".a" * n
    if kind == 6:
        return "[" * n + "]" * n
    if kind == 7:
        return "{% for i in x %}" * n + "{% endfor %}" * n
    return "{{ " + "-" * n + "1 }}"


def _many_states(rng: random.Random) -> str:
    count = rng.choice((50, 200, 600))
    lines = ["loopdsl: 1", "name: many", "start: s0", "states:"]
    for i in range(count):
        nxt = f"s{i + 1}" if i + 1 < count else rng.choice(("done", "s0", "nowhere"))
        if rng.random() < 0.2:
            lines += [f"  s{i}:", f"    shell: echo {{{{ s{max(i - 1, 0)}.stdout }}}}", "    transitions:",
                      f"      - {{to: {nxt}, when: \"s{rng.randrange(count)}.exit_code == 0\"}}",
                      f"      - {{to: s{rng.randrange(count)}}}"]
        else:
            lines += [f"  s{i}:", f"    shell: echo {i}", f"    next: {nxt}"]
    lines += ["  done:", "    end: completed"]
    return "\n".join(lines) + "\n"


def hostile_structure(rng: random.Random, text: str, huge: bool = True) -> str:
    """Deep nesting and hostile structure: Jinja nesting past the parser's recursion, deep
    YAML of every style, long chains of states, names ending in a newline, huge numbers.
    `huge`: sometimes 100,000 levels (seconds to lint; the unit test leaves them out)."""
    choice = rng.randrange(8)
    spans = _value_spans(text)
    lines = _lines(text)
    if choice <= 2:  # hostile Jinja where a template or expression is read
        replaced = _replace_template(rng, text, _deep_jinja(rng, huge))
        if replaced is not None:
            return replaced
    if choice == 3:
        return _many_states(rng)
    n = rng.choice((65, 1000, 20_000 if huge else 2000))
    value = rng.choice((
        "[" * n + "]" * n, "{a: " * n + "1" + "}" * n, "- " * n + "x",
        "\n" + "".join(" " * i + f"k{i}:\n" for i in range(min(n, 3000))),
        "9" * rng.choice((4301, 5000, 100_000 if huge else 6000)), '"x\\n"', '"\\x1b]52;c;aGk=\\x07"',
        "[" + ", ".join(["[1, [2, [3]]]"] * 2000) + "]",
    ))
    if choice == 4 and spans:
        start, end = rng.choice(spans)
        return text[:start] + value + text[end:]
    if choice == 5:  # a name (state, input) ending in a newline, or other odd keys
        keyed = [i for i, line in enumerate(lines) if re.match(r"^  [a-z_]+:", line)]
        if keyed:
            index = rng.choice(keyed)
            name = lines[index].split(":")[0].strip()
            lines[index] = "  " + rng.choice((f'"{name}\\n"', f'"{name}\\r"', f'"{name}\\u0000"', f'"{name} "')) + \
                lines[index][lines[index].index(":"):]
            return "\n".join(lines)
    return text + "\nhostile: " + value + "\n"


def truncate(rng: random.Random, text: str) -> str:
    return text[:rng.randrange(len(text) + 1)]


def data_level_edit(rng: random.Random, text: str) -> str:
    """Load, edit the data tree (delete / retype / move), dump back: valid YAML, odd loop."""
    from loopdsl.language.loader import load_text

    doc, _ = load_text(text)
    if doc is None:
        return text
    data = doc.data
    nodes: list[tuple[Any, Any]] = []  # (container, key) pairs, found breadth first

    def collect(node: Any) -> None:
        queue = [node]
        while queue and len(nodes) < 2000:
            current = queue.pop(0)
            items = current.items() if isinstance(current, dict) else enumerate(current) \
                if isinstance(current, list) else ()
            for key, value in items:
                nodes.append((current, key))
                queue.append(value)

    collect(data)
    for _ in range(rng.randint(1, 4)):
        if not nodes:
            break
        container, key = rng.choice(nodes)
        try:
            action = rng.randrange(4)
            if action == 0:
                del container[key]
            elif action == 1:
                container[key] = rng.choice(
                    [None, True, 0, -3, 2.5, "", "x", [], {}, [None], {"a": None}, "{{ x }}"])
            elif action == 2:
                other_container, other_key = rng.choice(nodes)
                container[key] = other_container[other_key]
            elif isinstance(container, dict):
                container[rng.choice(KEYS)] = container.pop(key)
        except (KeyError, IndexError):
            pass
    try:
        text_out = json.dumps(data, allow_nan=True) if rng.random() < 0.3 else _dump_yaml(data)
    except (ValueError, RecursionError):
        return text
    return text_out


def _dump_yaml(data: Any) -> str:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


TEXT_MUTATORS: list[Callable[[random.Random, str], str]] = [
    delete_lines, duplicate_line, swap_lines, reindent, flip_chars, insert_special,
    add_tag, swap_value, swap_key, anchors_aliases, deep_nesting, truncate, data_level_edit,
    hostile_structure, hostile_structure,
]


def to_bytes(rng: random.Random, text: str) -> bytes:
    """The file as bytes, sometimes with invalid UTF-8, NULs, BOMs or another encoding."""
    data = text.encode("utf-8", "surrogatepass")
    choice = rng.randrange(6)
    if choice == 0:
        index = rng.randrange(len(data) + 1)
        return data[:index] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[index:]
    if choice == 1:
        return rng.choice((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")) + data
    if choice == 2:
        return text.encode(rng.choice(("utf-16", "utf-16-le", "utf-32", "latin-1")), "replace")
    if choice == 3 and data:
        index = rng.randrange(len(data))
        return data[:index] + b"\x00" + data[index + 1:]
    return data


def random_file(rng: random.Random) -> str | bytes:
    kind = rng.randrange(5)
    size = rng.choice((0, 1, 5, 50, 500, 3000))
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(size))
    if kind == 1:  # YAML-ish token soup
        pieces = SPECIAL_TOKENS + KEYS + VALUES + TAGS + [" ", "  ", "\n", "\n  ", "\n- "]
        return "".join(rng.choice(pieces) for _ in range(size // 5 + 1))
    if kind == 2:
        return "".join(chr(rng.randrange(32, 127)) if rng.random() < 0.9 else "\n" for _ in range(size))
    if kind == 3:  # random structure from the DSL's own keys, as JSON (which is YAML)
        return json.dumps(_random_data(rng, 0))
    return "".join(chr(rng.randrange(0, 0x11000)) for _ in range(size))


def _random_data(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth > 5 or roll < 0.4:
        return rng.choice([None, True, False, 0, 1, -1, 1.5, "x", "done", "{{ x }}", "30s", ""])
    if roll < 0.6:
        return [_random_data(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(KEYS): _random_data(rng, depth + 1) for _ in range(rng.randint(0, 6))}


def make_case(seed: int, index: int, seeds: Sequence[str]) -> str | bytes:
    rng = random.Random(f"{seed}:{index}")
    if rng.random() < 0.1:
        return random_file(rng)
    text = rng.choice(seeds)
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        text = rng.choice(TEXT_MUTATORS)(rng, text)
    return to_bytes(rng, text) if rng.random() < 0.15 else text


# ------------------------------------------------------------------ the pipeline

@dataclass
class Pipeline:
    description: str
    run: Callable[[str, str | bytes], list[Any]]


def build_pipeline() -> Pipeline:
    """`loopdsl.lint.pipeline.lint_source` if it exists, else the stages that do (imported lazily)."""
    try:
        from loopdsl.lint.pipeline import lint_source
    except ImportError:
        pass
    else:
        return Pipeline("loopdsl.lint.pipeline.lint_source (full lint pipeline)", lint_source)

    from loopdsl.language.diagnostics import LoopError
    from loopdsl.language.loader import load_document

    stages = ["loader.load_document"]
    schema_check: Any
    build_loop: Any = None
    run_rules: Any = None
    try:
        from loopdsl.language.schema import check as schema_check
        stages.append("schema.check")
    except ImportError:
        schema_check = None
    if schema_check is not None:  # build_loop assumes schema-valid data
        try:
            from loopdsl.language.model import build_loop
            stages.append("model.build_loop")
        except ImportError:
            pass
    if build_loop is not None:
        try:
            from loopdsl.lint import registry as rules
            for extra in ("rules_templates", "rules_calls", "rules_jinja"):
                try:
                    __import__(f"loopdsl.{extra}")
                except ImportError:
                    pass
            run_rules = rules
            stages.append(f"rules ({len(rules.RULES)} registered)")
        except ImportError:
            pass

    def run(path: str, source: str | bytes) -> list[Any]:
        doc, diags = load_document(path, source)
        if doc is None or schema_check is None:
            return diags
        diags = diags + schema_check(doc)
        if any(d.is_error for d in diags) or build_loop is None:
            return diags
        try:
            loop = build_loop(doc.data, source=Path(path))
        except LoopError as exc:  # a user mistake, reported the way lint reports it
            return diags + list(exc.diagnostics)
        if run_rules is not None:
            ctx = run_rules.LintContext(doc=doc, loop=loop, path=path, source=Path(path))
            for rule_fn in run_rules.RULES:
                diags.extend(rule_fn(ctx))
        return diags

    return Pipeline("fallback: " + " + ".join(stages), run)


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so `except Exception` in the code under test
    cannot swallow it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout()


def check_case(pipeline: Pipeline, path: str, source: str | bytes, timeout: float) -> str | None:
    """None if the pipeline behaved; else a description of what went wrong."""
    from loopdsl.language.diagnostics import Diagnostic, format_github, format_json, format_text

    # SIGALRM only exists on Unix and can only be handled in the main thread.
    use_alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    previous_handler: Any = None
    if use_alarm:
        previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        diags = pipeline.run(path, source)
        problems = []
        for d in diags:
            if not isinstance(d, Diagnostic):
                problems.append(f"not a Diagnostic: {d!r}"[:300])
            elif not (isinstance(d.rule, str) and d.rule and isinstance(d.message, str)
                      and isinstance(d.line, int) and d.line >= 0
                      and isinstance(d.col, int) and d.col >= 0):
                problems.append(f"diagnostic breaks the contract: {d!r}"[:300])
            elif d.rule == "internal-error":
                # lint turns a crash inside loopdsl into this finding (exit 3): still a bug.
                problems.append(f"InternalError: {d.message}"[:500])
        if problems:
            first = problems[0]
            return first if first.startswith("InternalError") else \
                "BadDiagnostic: " + "; ".join(problems[:3])
        # What the CLI would print must render and encode.
        # The CLI shows snippets of the file as read from disk: bytes, decoded leniently.
        raw = source.encode("utf-8", "surrogatepass") if isinstance(source, str) else source
        text = raw.decode("utf-8", "replace")
        for rendered in (format_text(diags, {path: text.splitlines()}), format_json(diags),
                         format_github(diags)):
            rendered.encode("utf-8")
        return None
    except CaseTimeout:
        return f"Timeout: the case ran over {timeout:g} s"
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return "".join(traceback.format_exception(exc))
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)


def failure_signature(report: str) -> str:
    """Group failures by exception type and the innermost loopdsl frame."""
    if report.startswith(("InternalError", "BadDiagnostic", "Timeout")):
        return re.sub(r"'[^']*'|\d+", "_", report)[:160]
    lines = [line for line in report.splitlines() if line.strip()]
    where = next((line.strip() for line in reversed(lines)
                  if line.strip().startswith('File "') and "loopdsl" in line), "")
    last = lines[-1] if lines else report
    return f"{last.split(':')[0]} @ {where}" if where else last[:120]


# ------------------------------------------------------------------ driver

_WORKER: dict[str, Any] = {}


def _init_worker(timeout: float) -> None:
    _WORKER["pipeline"] = build_pipeline()
    _WORKER["seeds"] = seed_texts()
    _WORKER["timeout"] = timeout


def _run_one(job: tuple[int, int]) -> tuple[int, str | None, float]:
    seed, index = job
    source = make_case(seed, index, _WORKER["seeds"])
    started = time.perf_counter()
    failure = check_case(_WORKER["pipeline"], f"fuzz-{index}.yaml", source, _WORKER["timeout"])
    return index, failure, time.perf_counter() - started


def _results(jobs: list[tuple[int, int]], workers: int, timeout: float) -> Iterator[tuple[int, str | None, float]]:
    if workers <= 1:
        _init_worker(timeout)
        for job in jobs:
            yield _run_one(job)
        return
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(workers, _init_worker, (timeout,)) as pool:
        yield from pool.imap_unordered(_run_one, jobs, chunksize=50)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="number of inputs (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1: in-process)")
    parser.add_argument("--case", type=int, default=None, help="run only this case index")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case (default 10)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "loopdsl-fuzz",
                        help="where failing inputs are written")
    args = parser.parse_args(argv)

    indexes = [args.case] if args.case is not None else list(range(args.cases))
    jobs = [(args.seed, i) for i in indexes]
    print(f"pipeline: {build_pipeline().description}", flush=True)
    started = time.perf_counter()
    failures: dict[str, list[int]] = {}
    slowest = (0.0, -1)
    seeds = seed_texts()
    for done, (index, failure, elapsed) in enumerate(_results(jobs, args.jobs, args.timeout), 1):
        slowest = max(slowest, (elapsed, index))
        if failure is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            source = make_case(args.seed, index, seeds)
            stem = args.out / f"case-{args.seed}-{index}"
            stem.with_suffix(".yaml").write_bytes(
                source if isinstance(source, bytes) else source.encode("utf-8", "surrogatepass"))
            stem.with_suffix(".txt").write_text(failure, encoding="utf-8")
            failures.setdefault(failure_signature(failure), []).append(index)
        if done % 1000 == 0:
            print(f"  {done} cases, {sum(map(len, failures.values()))} failures, "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
    total = time.perf_counter() - started
    count = sum(map(len, failures.values()))
    print(f"cases: {len(jobs)}  elapsed: {total:.1f} s  ({1000 * total / max(len(jobs), 1):.1f} ms/case"
          f"{', ' + str(args.jobs) + ' workers' if args.jobs > 1 else ''})  "
          f"slowest: case {slowest[1]} {slowest[0] * 1000:.0f} ms  failures: {count}")
    for signature, cases in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(cases):5d} x {signature}  (e.g. {args.out}/case-{args.seed}-{cases[0]}.yaml)")
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
