"""Templates that would build huge or deep values by sharing references (`[x] * 10` four
levels deep, dict(a=x, b=x), namespaces holding namespaces, indented dumps of deep values)
fail fast with a RenderError, and the process stays small: each case runs in a real child
process under an address-space limit, reporting its peak memory and time."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a runaway dies instead of swapping
from loopdsl.language.templates import RenderError, compile_template
start = time.monotonic()
try:
    compile_template(sys.argv[1]).render({})
    outcome = "rendered"
except RenderError as exc:
    outcome = "RenderError: " + exc.message
except MemoryError:
    outcome = "MemoryError"
# VmHWM: this process's own peak (ru_maxrss would include the parent's, inherited at fork).
with open("/proc/self/status") as status:
    peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({"outcome": outcome, "seconds": time.monotonic() - start, "peak_mib": peak_kib / 1024}))
"""

BOMBS = {
    "nested repeat": "{{ [[[['x' * 100000] * 10] * 10] * 10] * 10 }}",
    "literals sharing": ("{% set a = ['x' * 100000] * 10 %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}"
                         "{% set c = [b, b, b, b, b, b, b, b, b, b] %}{{ [c, c, c, c, c, c, c, c, c, c] }}"),
    "repeat to json": "{{ ([[[['x' * 100000] * 10] * 10] * 10] * 10) | tojson | length }}",
    "dict doubling": ("{% set ns = namespace(x={}) %}{% for i in range(100) %}"
                      "{% set ns.x = dict(a=ns.x, b=ns.x) %}{% endfor %}{{ ns.x }}"),
    "namespace doubling": ("{% set ns = namespace(x=1) %}{% for i in range(100) %}"
                           "{% set ns.x = namespace(a=ns.x, b=ns.x) %}{% endfor %}{{ ns.x }}"),
    "namespace assignments": ("{% set o = namespace(p='y' * 1000) %}{% for i in range(100) %}"
                              "{% set n = namespace() %}{% set n.a = o.p %}{% set n.b = o.p %}"
                              "{% set o.p = n %}{% endfor %}{{ o }}"),
    "concatenation doubling": ("{% set ns = namespace(x=['y' * 1000]) %}{% for i in range(100) %}"
                               "{% set ns.x = ns.x + [ns.x] %}{% endfor %}{{ ns.x }}"),
    "deep nesting": ("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                     "{% endfor %}{{ ns.x }}"),
    # Each field of a format printed a 1 MB value: refused once the output's size was known.
    "str.format repeating a field": "{% set x = 'a' * 1000000 %}{{ ('{0}' * 4000).format(x) | length }}",
    "format filter repeating a field": "{% set x = 'a' * 1000000 %}{{ ('%(a)s' * 1000) | format(a=x) | length }}",
    "% repeating a field": "{% set x = 'a' * 1000000 %}{{ ('%s' * 40) % ((x,) * 40) | length }}",
    "join of a string": "{% set x = 'a' * 1000000 %}{{ x | join(x[:30000]) | length }}",
    # Not memory but CPU the step budget never counted (~14 s).
    "wordwrap at width 1": "{% set x = 'a' * 1000000 %}{{ x | wordwrap(1) | length }}",
    "indented dump of a deep value": ("{% set ns = namespace(v=[['x'] * 100000]) %}{% for i in range(150) %}"
                                      "{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v | tojson(indent=64) | length }}"),
}


@pytest.mark.parametrize("source", list(BOMBS.values()), ids=list(BOMBS))
def test_sharing_bombs_fail_fast_and_small(source: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, source], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["outcome"].startswith("RenderError"), report
    assert "memory" not in report["outcome"], report  # refused by a limit, not by running out
    assert report["seconds"] < 10, report
    assert report["peak_mib"] < 128, report  # the interpreter itself is ~25 MiB


def test_ordinary_structures_still_render() -> None:
    source = ("{% set rows = [{'name': 'a', 'tags': ['x', 'y']}, {'name': 'b', 'tags': []}] %}"
              "{% set ns = namespace(seen=[]) %}{% for r in rows %}{% set ns.seen = ns.seen + [r.name] %}{% endfor %}"
              "{{ ns.seen | join(',') }} {{ rows | tojson(indent=2) | length }} {{ dict(a=1, b=[1, 2]) }} "
              "{{ ([['-' * 100] * 100] * 10) | length }}")
    proc = subprocess.run([sys.executable, "-c", CHILD, source], capture_output=True, text=True, timeout=120)
    assert json.loads(proc.stdout)["outcome"] == "rendered", proc.stdout + proc.stderr
