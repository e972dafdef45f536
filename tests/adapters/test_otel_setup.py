"""When traces are on and where they go: the OTEL_* variables, a dead collector, a run killed
and resumed, the exporter's headers, and docs/observability.md's setup block, each through real
`loopdsl` processes and the loopback OTLP receiver (tests/otlp_receiver.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from otlp_receiver import ROOT, OtlpReceiver, dead_port, only, otel_env, run_loopdsl as loopdsl
from test_docs_shell import shell_blocks

from loopdsl.adapters.otel import trace_id_for, traces_requested
from loopdsl.adapters.store.run_store import RunStore

sys.path.insert(0, str(ROOT / "bench"))

import crash_torture as ct  # noqa: E402 - bench/ is not a package

SECRET = "otel-headers-SECRET-4Hn7"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    server = OtlpReceiver().start()
    try:
        yield server
    finally:
        server.stop()


def test_nothing_is_traced_without_the_variables_or_with_the_sdk_disabled(receiver: OtlpReceiver, tmp_path: Path) -> None:
    (tmp_path / "loop.yaml").write_text("loopdsl: 1\nname: quiet\nstart: a\nstates:\n"
                                        "  a: {shell: 'true', next: done}\n  done: {end: completed}\n")
    assert loopdsl(["run", "loop.yaml"], tmp_path, otel_env(None)).returncode == 0
    disabled = otel_env(receiver.endpoint, OTEL_SDK_DISABLED="true")
    assert loopdsl(["run", "loop.yaml"], tmp_path, disabled).returncode == 0
    assert loopdsl(["run", "loop.yaml"], tmp_path, otel_env(receiver.endpoint, OTEL_TRACES_EXPORTER="none")).returncode == 0
    assert receiver.bodies == []
    assert loopdsl(["run", "loop.yaml"], tmp_path, otel_env(receiver.endpoint)).returncode == 0
    assert [s.name for s in receiver.snapshot() if s.parent == ""] == ["run quiet"]  # the same setup does trace


def test_which_variables_turn_traces_on() -> None:
    assert not traces_requested({})
    assert traces_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert traces_requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not traces_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"})
    assert not traces_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"})
    assert not traces_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
def test_a_dead_collector_neither_fails_nor_holds_up_a_run(tmp_path: Path) -> None:
    (tmp_path / "loop.yaml").write_text("loopdsl: 1\nname: lonely\nstart: a\nstates:\n"
                                        "  a: {shell: 'true', next: done}\n  done: {end: completed}\n")
    timings = {}
    for label, endpoint in (("plain", None), ("dead", f"http://127.0.0.1:{dead_port()}")):
        started = time.monotonic()
        done = loopdsl(["run", "loop.yaml", "--store", "store"], tmp_path, otel_env(endpoint))
        timings[label] = time.monotonic() - started
        assert done.returncode == 0, done.stderr
    # The end of a run waits at most OTEL_BSP_EXPORT_TIMEOUT (2 s unless set) for the collector.
    assert timings["dead"] - timings["plain"] < 2.0 + 1.5, timings


def _wait_for(predicate: Any, proc: subprocess.Popen[str], what: str) -> None:
    ct.wait_until(predicate, proc, timeout=60.0, what=what)


def test_a_run_killed_and_resumed_stays_one_trace(receiver: OtlpReceiver, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    (tmp_path / "loop.yaml").write_text(textwrap.dedent(f"""\
        loopdsl: 1
        name: crashy
        start: one
        states:
          one: {{shell: 'true', next: slow}}
          slow:
            shell: if [ -e {marker} ]; then exit 0; fi; touch {marker}; sleep 30
            idempotent: true
            next: done
          done: {{end: completed}}
        """))
    env = ct.cli_env({**otel_env(receiver.endpoint), "OTEL_BSP_SCHEDULE_DELAY": "50"})
    store = tmp_path / "store"
    proc = ct.launch(["run", "loop.yaml", "--store", str(store)], tmp_path, env)
    _wait_for(lambda: marker.exists() and any(s.name == "state one" for s in receiver.snapshot()), proc,
              "the slow command and the first spans")
    assert ct.kill(proc)
    run_id = RunStore(store).list_runs()[0]["run_id"]
    before = receiver.snapshot()
    ct.wait_lock_free(store, run_id)
    resumed = subprocess.run([sys.executable, "-c", ct.LAUNCHER, "resume", run_id, "--store", str(store)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    spans = receiver.snapshot()
    assert {s.trace_id for s in spans} == {f"{trace_id_for(run_id):032x}"}
    after = spans[len(before):]
    [root] = [s for s in after if s.parent == ""]
    assert root.attributes["loopdsl.segment"] == "resume" and root.status == "OK"
    slow = [s for s in after if s.name == "state slow"]
    assert slow and all(s.parent == root.span_id for s in slow) and slow[-1].status == "OK"


def test_exporter_headers_reach_the_collector_but_never_a_command(receiver: OtlpReceiver, tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_HEADERS holds a back end's API key (Honeycomb's `x-honeycomb-team`)."""
    (tmp_path / "loop.yaml").write_text(textwrap.dedent("""\
        loopdsl: 1
        name: headers
        outputs: {seen: "{{ look.stdout }}"}
        start: look
        states:
          look: {shell: 'echo "${OTEL_EXPORTER_OTLP_HEADERS:-none} ${OTEL_EXPORTER_OTLP_TRACES_HEADERS:-none}"', next: done}
          done: {end: completed}
        """))
    env = otel_env(receiver.endpoint, OTEL_EXPORTER_OTLP_HEADERS=f"x-honeycomb-team={SECRET}",
                   OTEL_EXPORTER_OTLP_TRACES_HEADERS="x-scope-orgid=team-a")
    done = loopdsl(["run", "loop.yaml", "--json"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert '"seen": "none none' in done.stdout.replace("\\n", "")
    assert receiver.headers and all(h.get("x-scope-orgid") == "team-a" for h in receiver.headers)


def test_the_documented_setup_traces_a_run(receiver: OtlpReceiver, tmp_path: Path) -> None:
    """docs/observability.md's tested block, run as written against the loopback receiver."""
    [block] = shell_blocks((ROOT / "docs" / "observability.md").read_text(encoding="utf-8"))
    assert "http://localhost:4318" in block
    (tmp_path / "loops").mkdir()
    (tmp_path / "loops" / "triage.yaml").write_text("loopdsl: 1\nname: triage\nstart: a\nstates:\n"
                                                    "  a: {shell: 'true', next: done}\n  done: {end: completed}\n")
    env = otel_env(None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = "set -e\n" + block.replace("http://localhost:4318", receiver.endpoint)
    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    root = only(receiver.snapshot(), "run triage")
    assert root.resource["service.name"] == "nightly-triage" and root.status == "OK"


RUN_FIVE = """\
import json, sys, time
import loopdsl
took = []
for _ in range(5):
    started = time.monotonic()
    assert loopdsl.run(sys.argv[1]).status == "completed"
    took.append(time.monotonic() - started)
print(json.dumps(took))
"""


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
def test_a_dead_collector_costs_its_bound_once_per_process(tmp_path: Path) -> None:
    """Five API runs in one process (as `loopdsl test` makes): only the first waits the bound."""
    loop = tmp_path / "loop.yaml"
    loop.write_text("loopdsl: 1\nname: many\nstart: a\nstates:\n  a: {shell: 'true', next: done}\n  done: {end: completed}\n")
    took = {}
    for label, endpoint in (("plain", None), ("dead", f"http://127.0.0.1:{dead_port()}")):
        env = otel_env(endpoint, OTEL_BSP_EXPORT_TIMEOUT="1500")
        done = subprocess.run([sys.executable, "-c", RUN_FIVE, str(loop)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        took[label] = json.loads(done.stdout.splitlines()[-1])
    extra = [dead - plain for dead, plain in zip(took["dead"], took["plain"])]
    # The first run waited for the collector its whole OTEL_BSP_EXPORT_TIMEOUT (a dead port keeps
    # the exporter retrying for longer), so its own time is the lower bound: the difference to
    # the plain first run also holds both processes' first imports, which a loaded machine skews.
    assert took["dead"][0] > 1.5 - 0.01 and extra[0] < 1.5 + 2.0, took
    assert max(extra[1:]) < 0.2 + 0.5, took


WITHOUT_OTEL = (
    "import sys\n"
    "sys.modules['opentelemetry'] = None  # as if the `otel` extra were not installed\n"
    "sys.argv[0] = 'loopdsl'\n"
    "from loopdsl.cli import main\n"
    "main()\n"
)


def test_without_the_otel_extra_a_traced_run_warns_once_and_runs(receiver: OtlpReceiver, tmp_path: Path) -> None:
    (tmp_path / "loop.yaml").write_text("loopdsl: 1\nname: bare\nstart: a\nstates:\n"
                                        "  a: {shell: 'true', next: done}\n  done: {end: completed}\n")
    done = subprocess.run([sys.executable, "-c", WITHOUT_OTEL, "run", "loop.yaml"], cwd=tmp_path,
                          env=otel_env(receiver.endpoint), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [warning] = [line for line in done.stderr.splitlines() if "OpenTelemetry" in line]
    assert "pip install 'loopdsl[otel]'" in warning
    assert receiver.bodies == []
