"""A secret stays hidden in every form the redactor knows, in sub-loops and in error
messages: real runs, then a byte-wise search of what they printed and stored.

docs/dsl.md, secret rules 3 and 5. The loops here are lint-clean except the one built
without lint (the Python API accepts a Loop object): redaction must hold even for a form
lint forbids, because a loop file is not the only way a value reaches a run.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import quote

import pytest

import loopdsl
from loopdsl.language.model import build_loop
from cli_forked import loopdsl_command

pytestmark = pytest.mark.xdist_group("secret-forms-run")  # the run every test inspects, once (tests/conftest.py)
SECRET = 'zq9-S"ECRET/7Vx3kL+w8uniq'
PREFIXES = ["a:", "ab:", "abc:", "user:"]  # the secret at offsets 2, 0, 1, 2 (mod 3) of a base64 stream


def _middle(encoded: bytes, prefix_len: int) -> bytes:
    """16 characters of a base64 text that come from the secret's bytes alone."""
    start = -(-8 * prefix_len // 6) + 1
    return encoded[start:start + 16]


def _needles() -> dict[str, bytes]:
    raw = SECRET.encode()
    needles = {
        "raw": raw,
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
        "json": json.dumps(SECRET)[1:-1].encode(),
        "percent": quote(SECRET, safe="").encode(),
    }
    for prefix in PREFIXES:
        data = (prefix + SECRET).encode()
        needles[f"basic {prefix}"] = _middle(base64.b64encode(data), len(prefix))
        needles[f"urlsafe {prefix}"] = _middle(base64.urlsafe_b64encode(data), len(prefix))
    stream = b"x" * 41 + raw + b"y" * 90
    needles["wrapped"] = _middle(base64.b64encode(stream), 41)
    return needles


NEEDLES = _needles()

PRINT_FORMS = textwrap.dedent("""\
    import base64, json, os, sys, urllib.parse
    t = os.environ["MY_TOKEN"]
    for out in (sys.stdout, sys.stderr):
        print("raw", t, "hex", t.encode().hex(), t.encode().hex().upper(), file=out)
        print("json", json.dumps({"t": t}), "percent", urllib.parse.quote(t, safe=""), file=out)
        for p in %r:
            print("Authorization: Basic", base64.b64encode((p + t).encode()).decode(), file=out)
            print("urlsafe", base64.urlsafe_b64encode((p + t).encode()).decode(), file=out)
        s = base64.b64encode(("x" * 41 + t + "y" * 90).encode()).decode()
        for width in (76, 64):
            print("\\n".join(s[i:i + width] for i in range(0, len(s), width)), file=out)
    """) % (PREFIXES,)


def _normalised(data: bytes) -> bytes:
    """`data` with line breaks (and JSON-escaped ones) removed: wrapped base64 joins up."""
    return data.replace(b"\\r", b"").replace(b"\\n", b"").replace(b"\r", b"").replace(b"\n", b"")


def _leaks(data: bytes) -> list[str]:
    flat = _normalised(data)
    return [name for name, needle in NEEDLES.items() if needle in data or needle in flat]


PARENT = """\
loopdsl: 1
name: forms-parent
secrets: [MY_TOKEN]
start: emit
states:
  emit:
    shell:
      cmd: python3 -- "$PRINT_FORMS" | tee handed.txt
      env: {MY_TOKEN: "{{ secrets.MY_TOKEN }}", PRINT_FORMS: "{{ inputs.script }}"}
    next: child
  child:
    loop: child.yaml
    next: boom
  boom:
    shell:
      cmd: python3 -- "$PRINT_FORMS" >&2; exit 3
      env: {MY_TOKEN: "{{ secrets.MY_TOKEN }}", PRINT_FORMS: "{{ inputs.script }}"}
    next: done
  done: {end: completed}
inputs:
  script: {type: string}
"""
# The child declares no secret, yet reads the parent's value from a file the parent wrote.
CHILD = """\
loopdsl: 1
name: forms-child
start: look
states:
  look:
    shell: cat handed.txt
    next: done
  done:
    end: completed
    output: {seen: "{{ look.stdout }}"}
"""


@pytest.fixture(scope="module")
def forms_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("forms")
    (base / "loop.yaml").write_text(PARENT, encoding="utf-8")
    (base / "child.yaml").write_text(CHILD, encoding="utf-8")
    script = base / "print_forms.py"
    script.write_text(PRINT_FORMS, encoding="utf-8")
    work, store = base / "work", base / "store"
    work.mkdir()
    env = {**os.environ, "MY_TOKEN": SECRET}
    env.pop("LOOPDSL_STORE", None)
    proc = subprocess.run([*loopdsl_command(), "run", str(base / "loop.yaml"), "--json", "--store",
                           str(store), "--input", f"script={script}"], cwd=work, env=env, capture_output=True, timeout=180)
    summary = json.loads(proc.stdout.decode().splitlines()[-1])
    show = subprocess.run([*loopdsl_command(), "show", summary["run_id"], "--json", "--store", str(store)],
                          cwd=work, env=env, capture_output=True, timeout=60)
    return {"proc": proc, "summary": summary, "show": show, "store": store, "work": work}


def test_the_forms_run_printed_every_form_and_failed_at_the_end(forms_run: dict) -> None:
    proc = forms_run["proc"]
    assert proc.returncode == 1, proc.stderr.decode()[-3000:]
    assert forms_run["summary"]["path"] == ["emit", "child", "boom"]
    handed = (forms_run["work"] / "handed.txt").read_bytes()  # the command wrote the value itself
    assert _leaks(handed) == sorted(NEEDLES, key=list(NEEDLES).index)  # every needle is really there


def test_no_form_reaches_stdout_stderr_or_show(forms_run: dict) -> None:
    for stream in ("proc", "show"):
        done = forms_run[stream]
        assert _leaks(done.stdout) == [] and _leaks(done.stderr) == []
    assert b"Basic dXNlcjp***" in forms_run["proc"].stdout  # the "user:" part is not the secret


def test_no_form_reaches_any_store_file_including_the_childs_records(forms_run: dict) -> None:
    store: Path = forms_run["store"]
    files = [p for p in store.rglob("*") if p.is_file()]
    assert files
    assert {str(p.relative_to(store)): _leaks(p.read_bytes()) for p in files} == {str(p.relative_to(store)): [] for p in files}
    from loopdsl.adapters.store.run_store import RunStore

    with RunStore(store) as opened:
        child = opened.load(f"{forms_run['summary']['run_id']}.child")
    assert "***" in json.dumps(child)  # the child redacted its parent's secret


def test_only_the_file_the_command_wrote_holds_the_secret(forms_run: dict) -> None:
    work: Path = forms_run["work"]
    assert [p.name for p in work.rglob("*") if p.is_file() and _leaks(p.read_bytes())] == ["handed.txt"]


# ------------------------------------------------------------ without lint

LONG = "L0ng-" + "Kq8vT2mZ" * 12  # 101 characters: an error message quotes only the first 80


def _unlinted(tmp_path: Path) -> Path:
    """A parent loop with forms lint forbids (`with:` a secret, a derived secret); its
    child is an ordinary, lint-clean file."""
    (tmp_path / "child.yaml").write_text(textwrap.dedent("""\
        loopdsl: 1
        name: takes-a-token
        inputs:
          token: {type: string}
        start: use
        states:
          use:
            shell:
              cmd: printf 'got %s\\n' "$TOKEN"
              env: {TOKEN: "{{ inputs.token }}"}
            next: done
          done:
            end: completed
            output: {token: "{{ inputs.token }}", part: "{{ use.stdout }}"}
        """), encoding="utf-8")
    return tmp_path / "parent.yaml"


def test_a_secret_handed_down_or_quoted_by_an_error_is_redacted_even_without_lint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONG_TOKEN", LONG)
    source = _unlinted(tmp_path)
    loop = build_loop({
        "loopdsl": 1, "name": "unlinted", "secrets": ["LONG_TOKEN"], "start": "child",
        "states": {
            "child": {"loop": "child.yaml", "with": {"token": "{{ secrets.LONG_TOKEN }}"}, "next": "parse"},
            "parse": {"set": {"value": "secrets.LONG_TOKEN | fromjson"}, "next": "done"},
            "done": {"end": "completed"},
        },
    }, source)
    store = tmp_path / "store"
    result = loopdsl.run(loop, store=store, workdir=tmp_path)
    assert result.status == "failed" and result.path == ["child", "parse"]
    error = result.state.error or {}
    assert error["kind"] == "parse" and "fromjson" in error["message"] and "***" in error["message"]
    windows = {LONG[i:i + 12].encode() for i in range(len(LONG) - 11)}
    kept = [json.dumps(result.events).encode(), json.dumps(result.state.to_json()).encode()]
    kept += [p.read_bytes() for p in store.rglob("*") if p.is_file()]
    assert [w for w in windows if any(w in data for data in kept)] == []
    child = loopdsl.load(tmp_path / "child.yaml")  # a lint-clean child: the redaction is the parent's
    assert child.secrets == ()


# ------------------------------------------------------------ scoping (secret rules 1)

SCOPED = """\
loopdsl: 1
name: scoped
secrets: [MY_TOKEN, OTHER_TOKEN]
gates:
  blind: {shell: "! printenv MY_TOKEN"}        # fails if the gate's command sees the secret
start: given
states:
  given:
    shell:
      cmd: printenv MY_TOKEN | wc -c; printenv OTHER_TOKEN || echo other-unset
      env: {MY_TOKEN: "{{ secrets.MY_TOKEN }}"}
    next: blind
  blind:
    shell: "env | grep -c -e scoped-value-123 -e other-value-456 || true"
    gates:
      after: [{ref: blind}]
    next: done
  done:
    end: completed
    output: {given: "{{ given.stdout }}", blind: "{{ blind.stdout | trim }}"}
"""


def test_a_command_gets_only_the_secrets_its_env_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TOKEN", "scoped-value-123")
    monkeypatch.setenv("OTHER_TOKEN", "other-value-456")
    (tmp_path / "scoped.yaml").write_text(SCOPED, encoding="utf-8")
    assert loopdsl.load(tmp_path / "scoped.yaml").secrets == ("MY_TOKEN", "OTHER_TOKEN")  # lint-clean
    result = loopdsl.run(tmp_path / "scoped.yaml", workdir=tmp_path)
    assert result.status == "completed", result.state.error
    assert result.outputs == {"given": "17\nother-unset\n", "blind": "0"}
    gate = [e for e in result.events if e["type"] == "gate"]
    assert gate and gate[0]["passed"]
