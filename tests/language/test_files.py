"""Reading files a user or a loop file names: a path is hostile (a mistyped path to a huge
log, `/dev/zero`, a FIFO nobody writes to), and no read may run without end, fill the
memory or hang. Unit cases on language/files.py, then the commands that read such paths,
each in a thread or process with a deadline, so that a read without end fails the test
instead of hanging the suite."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from loopdsl.language.files import MAX_FILE_BYTES, TOO_LARGE, NotARegularFile, file_sha256, read_capped, read_head

LOOP = "loopdsl: 1\nname: ok\nstart: a\nstates:\n  a: {end: completed}\n"


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """What `call` returns (or raises), failing the test if it takes longer than `seconds`."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_a_file_over_the_cap_is_refused_and_one_at_it_is_read(tmp_path: Path) -> None:
    at_cap, over = tmp_path / "at.yaml", tmp_path / "over.yaml"
    for path, size in ((at_cap, MAX_FILE_BYTES), (over, MAX_FILE_BYTES + 1)):
        with path.open("wb") as handle:
            handle.truncate(size)  # sparse: cheap to make
    assert len(read_capped(at_cap)) == MAX_FILE_BYTES
    with pytest.raises(OSError) as refused:
        read_capped(over)
    assert refused.value.strerror == TOO_LARGE and "10 MiB" in TOO_LARGE


def test_an_endless_device_is_refused_at_the_cap() -> None:
    with pytest.raises(OSError) as refused:
        within(30, lambda: read_capped("/dev/zero"))
    assert refused.value.strerror == TOO_LARGE
    with pytest.raises(NotARegularFile):
        within(30, lambda: read_head("/dev/zero"))
    with pytest.raises(NotARegularFile):
        within(30, lambda: file_sha256("/dev/zero"))


def test_a_fifo_nobody_writes_to_reads_as_empty_and_a_pipe_from_a_writer_as_sent(tmp_path: Path) -> None:
    fifo = tmp_path / "loop.yaml"
    os.mkfifo(fifo)
    assert within(30, lambda: read_capped(fifo)) == b""  # a plain open() would wait for a writer forever
    # `loopdsl lint <(...)`: bash hands over /dev/fd/N, a pipe whose writer is already there.
    read = "import sys; from loopdsl.language.files import read_capped; sys.stdout.buffer.write(read_capped(sys.argv[1]))"
    done = subprocess.run(["bash", "-c", f'"$0" -c "$1" <(sleep 0.2; printf %s "$2")', sys.executable, read, LOOP],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == LOOP, done


def test_heads_and_digests_are_of_regular_files(tmp_path: Path) -> None:
    file = tmp_path / "a.yaml"
    file.write_bytes(b"x" * 100_000)
    assert read_head(file) == b"x" * 65536 and read_head(file, 10) == b"x" * 10
    assert file_sha256(file) == hashlib.sha256(b"x" * 100_000).hexdigest()
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    with pytest.raises(NotARegularFile):
        within(30, lambda: read_head(fifo))


# The commands run in one process of their own, its memory capped: a read without end there
# fails the test with a MemoryError, not the test worker (or the machine) with the OOM killer.
COMMANDS = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from click.testing import CliRunner
from loopdsl.cli import cli
out = []
for args in json.loads(sys.argv[1]):
    done = CliRunner().invoke(cli, args)
    out.append({"args": args, "code": done.exit_code, "out": done.stdout, "err": done.stderr,
                "raised": repr(done.exception) if done.exit_code not in (0, 1, 2) else None})
print(json.dumps(out))
"""


def commands(cwd: Path, *argvs: list[str]) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    done = subprocess.run([sys.executable, "-c", COMMANDS, json.dumps(argvs)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    results: list[dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
    return results


def test_lint_passes_over_a_fifo_in_a_folder_and_reads_a_named_one(tmp_path: Path) -> None:
    (tmp_path / "loops").mkdir()
    (tmp_path / "loops" / "ok.yaml").write_text(LOOP)
    os.mkfifo(tmp_path / "loops" / "pipe.yaml")
    folder, named = commands(tmp_path, ["lint", "loops"], ["lint", "loops/pipe.yaml"])
    assert folder["code"] == 0 and "in 1 file" in folder["out"] + folder["err"], folder
    assert named["code"] == 1 and "[yaml-empty]" in named["out"], named


def test_loops_inputs_imports_and_skills_at_endless_paths_are_errors_not_hangs(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(LOOP)
    (tmp_path / "skill.md").symlink_to("/dev/zero")
    (tmp_path / "lib.yaml").symlink_to("/dev/zero")
    (tmp_path / "uses.yaml").write_text(
        "loopdsl: 1\nname: uses\nimports: [lib.yaml]\nmodels: {m: {model: openai/gpt-4o-mini, max_tokens: 10}}\n"
        "budget: {tokens: 1000}\nstart: a\nstates:\n  a: {llm: {model: m, prompt: hi, skill: skill.md}, next: b}\n"
        "  b: {end: completed}\n")
    loop, inputs, lint, cost, lock = commands(
        tmp_path, ["run", "/dev/zero", "--dry-run"], ["run", "ok.yaml", "--inputs", "/dev/zero"],
        ["lint", "uses.yaml"], ["cost", "uses.yaml"], ["lock", "."])
    assert loop["code"] == 2 and TOO_LARGE in loop["err"], loop
    assert inputs["code"] == 2 and f"cannot read --inputs file /dev/zero: {TOO_LARGE}" in inputs["err"], inputs
    assert lint["code"] == 1 and "lib.yaml" in lint["out"] and "skill.md" in lint["out"], lint
    for done in (cost, lock):
        assert done["raised"] is None and "Traceback" not in done["out"] + done["err"], done


def test_a_name_too_long_for_the_system_is_a_missing_file_to_every_command(tmp_path: Path) -> None:
    """pathlib raises ENAMETOOLONG from is_file/exists/is_dir; `lint`, `lock` and `test` once
    stopped with an internal error on such a name (given, or in a test file's `loop:`)."""
    long = "x" * 300
    (tmp_path / "long.test.yaml").write_text(f"loop: {long}.yaml\n")
    (tmp_path / "tools.yaml").write_text(
        "loopdsl: 1\nname: tools\nunattended: true\nmodels: {m: {model: openai/gpt-4o-mini, max_tokens: 10}}\n"
        f"budget: {{tokens: 1000}}\ntools:\n  sub: {{description: d, loop: {long}.yaml}}\nstart: a\nstates:\n"
        "  a: {agent: {model: m, prompt: hi, tools: [sub], max_turns: 2}, next: b}\n  b: {end: completed}\n")
    results = commands(tmp_path, ["lint", long], ["validate", long], ["lock", long], ["test", long], ["graph", long],
                       ["cost", long], ["run", long], ["schedule", long], ["test", "long.test.yaml"], ["lint", "tools.yaml"])
    for done in results:
        assert done["code"] in (1, 2) and done["raised"] is None, done
        assert "internal error" not in done["out"] + done["err"], done
    assert f'the sub-loop "{long}.yaml" of tool "sub" does not exist' in results[-1]["out"], results[-1]
