"""Sub-loops (`loop:` states) and fan-out (`for_each`), run in-process with real shells,
a real run store and scripted replies: what a child sees, what it may spend, how its
events nest, and how fan-out orders, limits and tolerates its children.

The loops are in tests/data/sharing/subloops/.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import loopdsl
from loopdsl.cli import cli
from loopdsl.adapters.store.run_store import RunStore
from loopdsl.language.diagnostics import LoopError

DATA = Path(__file__).parents[1] / "data" / "sharing" / "subloops"


@pytest.fixture
def loops(tmp_path: Path) -> Path:
    """A private copy of the sub-loop test loops (tests may add files beside them)."""
    folder = tmp_path / "loops"
    shutil.copytree(DATA, folder)
    return folder


def _lint(paths: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(cli, ["lint", *paths], catch_exceptions=False)


def _script(path: Path, replies: dict[str, list[tuple[str, int, int]]]) -> Path:
    data = {state: [{"text": text, "usage": {"prompt_tokens": p, "completion_tokens": c}} for text, p, c in entries]
            for state, entries in replies.items()}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- with:


def test_with_is_checked_against_the_childs_inputs_at_lint_time(loops: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (loops / "bad_with.yaml").write_text("""\
loopdsl: 1
name: bad-with
start: typed
states:
  typed:
    loop: fan_child.yaml
    with: {name: 42, stamps: /tmp, delay: "0"}
    next: unknown
  unknown:
    loop: fan_child.yaml
    with: {name: a, stamp: /tmp}
    next: secret
  secret:
    loop: secrets_child.yaml
    with: {text: hi}
    next: done
  done: {end: completed}
""")
    result = _lint(["bad_with.yaml"], loops, monkeypatch)
    assert result.exit_code == 1
    found = [line for line in result.stdout.splitlines() if line.startswith("bad_with.yaml:")]
    assert found == [
        'bad_with.yaml:7:18: error: input "name" of sub-loop "fan_child.yaml" is string, got integer 42 [with-type]',
        'bad_with.yaml:11:5: error: sub-loop "fan_child.yaml" needs input stamps, not given in `with:` [with-missing-input]',
        ('bad_with.yaml:11:21: error: sub-loop "fan_child.yaml" has no input "stamp" (did you mean "stamps"?) '
         "[with-unknown-input]"),
        ('bad_with.yaml:14:11: error: sub-loop "secrets_child.yaml" declares secret SHARED_TOKEN, which this loop '
         "does not declare [child-secret]"),
    ]
    assert "  hint: its inputs are: delay, name, stamps" in result.stdout
    # The same checks stop `loopdsl run` before anything runs.
    monkeypatch.chdir(loops)
    ran = CliRunner().invoke(cli, ["run", "bad_with.yaml", "--no-store"])
    assert ran.exit_code == 2 and "[with-type]" in ran.stderr and "Traceback" not in ran.output


def test_a_templated_with_value_reaches_a_number_input(loops: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (loops / "count_child.yaml").write_text("""\
loopdsl: 1
name: count-child
inputs:
  lines: {type: integer}
start: done
states:
  done: {end: completed, output: {twice: "{{ inputs.lines * 2 }}"}}
""")
    (loops / "count_parent.yaml").write_text("""\
loopdsl: 1
name: count-parent
inputs:
  lines: {type: integer, default: 3}
start: child
states:
  child:
    loop: count_child.yaml
    with: {lines: "{{ inputs.lines }}"}
    next: done
  done: {end: completed, output: {twice: "{{ child.twice }}"}}
""")
    assert _lint(["count_parent.yaml"], loops, monkeypatch).exit_code == 0
    result = loopdsl.run(loops / "count_parent.yaml", workdir=loops)
    assert result.status == "completed", result.state.error
    assert result.outputs == {"twice": 6}  # a single {{ expr }} keeps its type


# --------------------------------------------------------------------------- isolation


def test_a_child_sees_only_its_with_inputs_and_the_secrets_it_declares(
        loops: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARENT_TOKEN", "parent-secret-value")
    monkeypatch.setenv("SHARED_TOKEN", "shared-secret-value")
    result = loopdsl.run(loops / "secrets_parent.yaml", {"parent_only": "the parent"}, workdir=tmp_path)
    assert result.status == "completed", result.state.error
    assert result.outputs == {
        "parent_seen": "PARENT_TOKEN=set\nSHARED_TOKEN=set",
        "child_seen": "PARENT_TOKEN=unset\nSHARED_TOKEN=set",  # PARENT_TOKEN is not the child's
        "child_inputs": "mood,text",  # its own inputs (with defaults), none of the parent's
        "child_text": "from the parent",
        # The child's end output is the state's result, usable in later templates.
        "used": "child said PARENT_TOKEN=unset SHARED_TOKEN=set / mood,text",
    }
    assert result.path == ["look", "child", "use", "done"]


def test_a_child_stops_at_the_parents_remaining_budget(loops: Path, tmp_path: Path) -> None:
    # Each call reports 30 + 20 tokens; the child's own cap (100000) is far above the
    # parent's (200), so the parent's cap is the one that stops it.
    script = _script(tmp_path / "s.json", {"ask": [("line", 30, 20)] * 20})
    result = loopdsl.run(loops / "budget_parent.yaml", script=script, store=tmp_path / "store", workdir=tmp_path)
    assert result.status == "budget_exhausted"  # the shared budget ran out: the parent is out of it too
    error = result.state.error or {}
    assert error["kind"] == "budget" and error["state"] == "spend"
    assert "over the cap of 200 (the enclosing run's budget" in error["message"]
    assert 150 <= result.tokens <= 200  # spent never passes the parent's cap
    with RunStore(tmp_path / "store") as store:
        child = store.load(f"{result.run_id}.spend")
    assert child["status"] == "budget_exhausted" and child["parent"] == result.run_id
    assert child["ledger"]["tokens"] == result.tokens  # everything the parent spent, the child spent
    calls = [e for e in result.events if e["type"] == "child" and e["event"]["type"] == "llm"]
    assert len(calls) == result.tokens // 50


def test_child_events_nest_and_show_lists_the_sub_loops(loops: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = loopdsl.run(loops / "secrets_parent.yaml", store=store, workdir=tmp_path)
    assert result.status == "completed"
    nested = [e for e in result.events if e["type"] == "child"]
    assert {e["run_id"] for e in nested} == {f"{result.run_id}/child"}
    assert [e["event"]["type"] for e in nested if e["event"]["type"] in ("enter", "end")] == ["enter", "end"]
    with RunStore(store) as probe:
        parent_events = probe.events(result.run_id)
        child = probe.load(f"{result.run_id}.child")
    assert any(e["type"] == "child" for e in parent_events)  # the parent's committed log has them too
    assert child["parent"] == result.run_id and child["run_id"] == f"{result.run_id}/child"

    shown = CliRunner().invoke(cli, ["show", result.run_id, "--store", str(store)], catch_exceptions=False)
    assert shown.exit_code == 0
    lines = shown.stdout.splitlines()
    at = lines.index("sub-loops:")
    assert lines[at + 1].startswith(f"  {result.run_id}/child: completed  path look -> done")
    listed = CliRunner().invoke(cli, ["runs", "--store", str(store)], catch_exceptions=False)
    assert f"{result.run_id}.child" not in listed.stdout and result.run_id in listed.stdout  # children only in `show`


# --------------------------------------------------------------------------- fan-out


def _intervals(stamps: Path, names: list[str]) -> list[tuple[float, float]]:
    return [(float((stamps / f"{n}.start").read_text()), float((stamps / f"{n}.end").read_text())) for n in names]


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak


def test_fan_out_keeps_item_order_and_runs_at_most_n_children_at_once(loops: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    # The first item is the slowest: children finish in another order than they start.
    items = [{"name": "a", "delay": "0.9"}, {"name": "b", "delay": "0.1"}, {"name": "c", "delay": "0.4"},
             {"name": "d", "delay": "0.1"}, {"name": "e", "delay": "0.1"}]
    result = loopdsl.run(loops / "fan_parent.yaml", {"items": items, "stamps": str(stamps)},
                         store=tmp_path / "store", workdir=tmp_path)
    assert result.status == "completed", result.state.error
    assert result.outputs == {"said": "did a,did b,did c,did d,did e",
                              "statuses": "completed,completed,completed,completed,completed", "failures": 0}
    names = [i["name"] for i in items]
    spans = _intervals(stamps, names)
    assert sorted(names, key=lambda n: spans[names.index(n)][1]) != names  # completion order differs
    assert _max_overlap(spans) == 2  # concurrency: 2, and it did run two at once
    fan = result.state.results["fan"]
    assert fan["items"] == [{"status": "completed", "outputs": {"said": f"did {n}"}} for n in names]
    with RunStore(tmp_path / "store") as probe:
        children = {r["run_id"]: r for r in probe.list_runs() if r.get("parent") == result.run_id}
    assert sorted(children) == [f"{result.run_id}/fan/{i}" for i in range(5)]
    assert [children[f"{result.run_id}/fan/{i}"]["inputs"]["name"] for i in range(5)] == names


def test_a_failed_child_sends_the_fan_out_state_to_on_failure(loops: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    items = [{"name": "a", "delay": "0"}, {"name": "bad", "delay": "0"}, {"name": "c", "delay": "0"}]
    result = loopdsl.run(loops / "fan_parent.yaml", {"items": items, "stamps": str(stamps)}, workdir=tmp_path)
    assert result.status == "failed"
    assert result.path == ["fan", "recover", "gave_up"]
    assert result.outputs == {"why": "1 of 3 children of 'fan' failed (tolerate_failures: 0)"}
    assert all((stamps / f"{n}.end").exists() for n in ("a", "bad", "c"))  # the others still ran


def test_tolerate_failures_lets_the_fan_out_state_succeed(loops: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    items = [{"name": "a", "delay": "0"}, {"name": "bad", "delay": "0"}, {"name": "c", "delay": "0"}]
    result = loopdsl.run(loops / "fan_tolerant.yaml", {"items": items, "stamps": str(stamps)}, workdir=tmp_path)
    assert result.status == "completed", result.state.error
    assert result.path == ["fan", "report", "done"]
    assert result.outputs == {"said": "did a,-,did c", "statuses": "completed,failed,completed", "failures": 1}

    # Two failures are one more than tolerated.
    items[0]["name"] = "bad"
    again = loopdsl.run(loops / "fan_tolerant.yaml", {"items": items, "stamps": str(stamps)}, workdir=tmp_path)
    assert again.path == ["fan", "recover", "gave_up"]
    assert again.outputs == {"why": "2 of 3 children of 'fan' failed (tolerate_failures: 1)"}


def test_a_child_waiting_for_a_person_makes_the_parent_wait_and_takes_its_decision(tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text(
        "loopdsl: 1\nname: child\nstart: ask\nstates:\n"
        "  ask: {checkpoint: {message: 'ship it?'}, transitions: [{to: done, when: \"ask.decision == 'approve'\"}, {to: no}]}\n"
        "  done: {end: completed, output: {by: '{{ ask.by }}'}}\n"
        "  no: {end: failed}\n")
    (tmp_path / "parent.yaml").write_text(
        "loopdsl: 1\nname: parent\nbudget: {steps: 20}\nstart: sub\nstates:\n"
        "  sub: {loop: child.yaml, next: done}\n"
        "  done: {end: completed, output: {child_by: '{{ sub.by }}'}}\n")
    for choice, status in (("approve", "completed"), ("reject", "failed")):
        store = tmp_path / f"store-{choice}"
        first = loopdsl.run(tmp_path / "parent.yaml", store=store, workdir=tmp_path)
        assert first.status == "waiting" and first.exit_code == 4
        assert first.state.waiting["child"] == f"{first.run_id}/sub"
        assert "ship it?" in first.state.waiting["message"]
        loopdsl.decide(first.run_id, choice, "looked at it", store=store, by="dana")
        done = loopdsl.resume(first.run_id, store=store)
        assert done.status == status, done.state.error
        if choice == "approve":
            assert done.outputs == {"child_by": "dana"}


def test_a_long_loop_state_name_still_gives_a_valid_child_run_id(loops: Path, tmp_path: Path) -> None:
    # The store id of a child nests under its parent's; a long state name (and fan-out
    # index, and visit) must not make it an invalid run id mid-run.
    long_name = "a" + "_very_long_state_name" * 4
    parent = loops / "long_parent.yaml"
    parent.write_text(f"""\
loopdsl: 1
name: long-parent
inputs:
  stamps: {{type: string}}
start: {long_name}
states:
  {long_name}:
    loop: fan_child.yaml
    for_each: "['x', 'y']"
    with: {{name: "{{{{ item }}}}", stamps: "{{{{ inputs.stamps }}}}"}}
    next: done
  done:
    end: completed
""")
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    store = tmp_path / "store"
    result = loopdsl.run(parent, {"stamps": str(stamps)}, store=store, workdir=tmp_path)
    assert result.status == "completed", result.state.error
    with RunStore(store) as probe:
        children = [r for r in probe.list_runs() if r.get("parent") == result.run_id]
    assert sorted(c["run_id"] for c in children) == [f"{result.run_id}/{long_name}/{i}" for i in (0, 1)]
    shown = CliRunner().invoke(cli, ["show", result.run_id, "--store", str(store)], catch_exceptions=False)
    assert shown.exit_code == 0 and f"{result.run_id}/{long_name}/1: completed" in shown.stdout


_PARENT = """\
loopdsl: 1
name: parent
budget: {steps: 20}
start: edit
states:
  edit: {shell: "%s", next: child}
  child: {loop: child.yaml, on_failure: fell_back, next: done}
  fell_back: {end: failed}
  done: {end: completed}
"""
_CHILD = ("loopdsl: 1\nname: child\nunattended: true\nstart: say\nstates:\n"
          "  say: {shell: echo ORIGINAL, next: done}\n  done: {end: completed}\n")


def test_a_sub_loop_changed_during_the_run_is_not_run(tmp_path: Path) -> None:
    """A state of the run rewrote its sub-loop's file: the new one ran, and the run's record
    kept the digest of the file as it was at the start. It is refused now, as `resume` refuses
    a changed file; a child that no longer loads fails its state, which `on_failure` routes."""
    (tmp_path / "child.yaml").write_text(_CHILD)
    (tmp_path / "parent.yaml").write_text(_PARENT % "sed -i s/ORIGINAL/SWAPPED/ child.yaml")
    changed = loopdsl.run(tmp_path / "parent.yaml", store=tmp_path / "store", workdir=tmp_path)
    assert changed.status == "failed" and "changed since the run started" in changed.state.error["message"]
    assert changed.state.path == ["edit", "child"]  # refused outright: not routed, never run
    # In memory (nothing recorded, nothing pinned) a child that no longer loads was an internal error.
    (tmp_path / "child.yaml").write_text(_CHILD)
    (tmp_path / "parent.yaml").write_text(_PARENT % "rm child.yaml && mkdir child.yaml")
    broken = loopdsl.run(tmp_path / "parent.yaml", workdir=tmp_path)
    assert broken.status == "failed" and broken.state.path[-1] == "fell_back"  # a state failure, routed


def test_for_each_over_a_string_or_a_mapping_fails_instead_of_fanning_over_its_parts(tmp_path: Path) -> None:
    """A string fanned out one child per character (8 for "src/a.py"), a mapping over its keys."""
    (tmp_path / "child.yaml").write_text("loopdsl: 1\nname: child\ninputs: {x: {type: string}}\nstart: a\n"
                                         "states:\n  a: {shell: 'true', next: done}\n  done: {end: completed}\n")
    for value in ('"src/a.py"', '{"a": 1}'):
        (tmp_path / "parent.yaml").write_text(
            "loopdsl: 1\nname: parent\nstart: each\nstates:\n"
            f"  each: {{loop: child.yaml, for_each: '{value}', with: {{x: \"{{{{ item }}}}\"}}, next: done}}\n"
            "  done: {end: completed}\n")
        result = loopdsl.run(tmp_path / "parent.yaml", workdir=tmp_path)
        assert result.status == "failed", result.state.results
        assert "is a string, not a list" in result.state.error["message"] or \
            "is a mapping, not a list" in result.state.error["message"], result.state.error
        assert "changed.stdout.splitlines()" in result.state.error["message"]
    (tmp_path / "parent.yaml").write_text(
        "loopdsl: 1\nname: parent\nstart: each\nstates:\n"
        "  each: {loop: child.yaml, for_each: '[\"a\", \"b\"]', with: {x: \"{{ item }}\"}, next: done}\n"
        "  done: {end: completed}\n")
    assert loopdsl.run(tmp_path / "parent.yaml", workdir=tmp_path).status == "completed"


def test_a_retried_loop_state_runs_its_child_again(tmp_path: Path) -> None:
    """Each attempt read back the first attempt's failed child: three attempts, one child run."""
    (tmp_path / "flaky.yaml").write_text(
        "loopdsl: 1\nname: flaky\nstart: s\nstates:\n"
        "  s: {shell: 'n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; test $n -ge 2', next: done}\n"
        "  done: {end: completed}\n")
    (tmp_path / "parent.yaml").write_text(
        "loopdsl: 1\nname: parent\nstart: c\nstates:\n"
        "  c: {loop: flaky.yaml, retry: {max_attempts: 3, backoff: {initial: 0s}}, next: done}\n"
        "  done: {end: completed}\n")
    result = loopdsl.run(tmp_path / "parent.yaml", store=tmp_path / "store", workdir=tmp_path)
    assert result.status == "completed", result.state.error
    assert (tmp_path / "count").read_text() == "2\n"  # the child ran twice: failed, then passed
    with RunStore(tmp_path / "store") as store:
        children = sorted(r["run_id"] for r in store.list_runs() if r.get("parent"))
    assert len(children) == 2, children


def test_a_loop_that_runs_itself_without_a_step_or_time_budget_does_not_lint(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """It was a warning, and the run never ended: each level started the next at once, the
    store growing by gigabytes a minute."""
    (tmp_path / "rec.yaml").write_text("loopdsl: 1\nname: rec\nstart: c\nstates:\n"
                                       "  c: {loop: rec.yaml, next: done}\n  done: {end: completed}\n")
    linted = _lint(["rec.yaml"], tmp_path, monkeypatch)
    assert linted.exit_code == 1 and "error: sub-loop \"rec.yaml\" runs a loop that is already running it" in linted.output
    assert "no `budget.steps` or `budget.wall_time` stops it [loop-recursion]" in linted.output
    with pytest.raises(LoopError):
        loopdsl.run(tmp_path / "rec.yaml", workdir=tmp_path)
    (tmp_path / "rec.yaml").write_text("loopdsl: 1\nname: rec\nbudget: {steps: 6}\nstart: c\nstates:\n"
                                       "  c: {loop: rec.yaml, next: done}\n  done: {end: completed}\n")
    assert "warning: sub-loop" in _lint(["rec.yaml"], tmp_path, monkeypatch).output
    assert loopdsl.run(tmp_path / "rec.yaml", workdir=tmp_path).status in ("budget_exhausted", "failed")


def test_a_null_with_value_is_a_lint_error_and_the_input_error_says_null(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`with: {n: null}` linted clean, and the child then failed with "got NoneType None"."""
    (tmp_path / "child.yaml").write_text("loopdsl: 1\nname: child\ninputs: {n: {type: integer}}\nstart: a\n"
                                         "states:\n  a: {shell: 'true', next: done}\n  done: {end: completed}\n")
    (tmp_path / "parent.yaml").write_text("loopdsl: 1\nname: parent\nstart: c\nstates:\n"
                                          "  c: {loop: child.yaml, with: {n: null}, next: done}\n  done: {end: completed}\n")
    linted = _lint(["parent.yaml"], tmp_path, monkeypatch)
    assert linted.exit_code == 1 and 'input "n" of sub-loop "child.yaml" is integer, got null [with-type]' in linted.output
    (tmp_path / "nulls.yaml").write_text("n: null\n")
    ran = CliRunner().invoke(cli, ["run", "child.yaml", "--inputs", "nulls.yaml", "--no-store"])
    assert ran.exit_code == 2 and "input 'n' must be an integer, got null" in ran.output, ran.output
