"""MCP tools against a real stdio MCP server (tests/adapters/mcp_server.py, the `mcp` SDK's
FastMCP) started by the code under test: listing, allow and rename, results of every kind,
timeouts, crashes, startup failures, environment isolation, redaction and process cleanup."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("mcp")

from loopdsl.adapters import mcp_stdio  # noqa: E402
from loopdsl.adapters.mcp_results import render_result  # noqa: E402
from loopdsl.adapters.mcp_tools import (  # noqa: E402
    DESCRIPTION_LIMIT, McpEntry, McpStartError, McpToolBox, server_environment,
)
from loopdsl.runtime.redaction import Redactor  # noqa: E402
from loopdsl.runtime.tools.base import safe_output  # noqa: E402
from loopdsl.runtime.tools.base import CUT_MARKER  # noqa: E402

SERVER = str(Path(__file__).with_name("mcp_server.py"))
SECRET = "tok-5ecret-VALUE-42"
T = TypeVar("T")


def entry(allow: Sequence[Any], *mode: str, env: Mapping[str, str] | None = None,
          startup_timeout: float = 20.0) -> McpEntry:
    return McpEntry.build("srv", [sys.executable, SERVER, *mode],
                          {"TOKEN": SECRET} if env is None else env, allow, startup_timeout)


def with_box(allow: Sequence[Any], body: Callable[[McpToolBox], Awaitable[T]], *mode: str,
             redactor: Redactor | None = None, **kwargs: Any) -> T:
    """Open a box, run `body` with it, always close it; returns what `body` returned."""
    async def main() -> T:
        box = await McpToolBox.open(entry(allow, *mode), redactor=redactor or Redactor([SECRET]), **kwargs)
        try:
            return await body(box)
        finally:
            await box.aclose()
    return asyncio.run(main())


def live_in_group(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies, read from /proc (independent of the
    code under test)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                raw = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            fields = raw[raw.rfind(b")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                found.append(int(name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def test_offers_only_allowed_tools_under_their_names_with_the_servers_schemas() -> None:
    async def body(box: McpToolBox) -> None:
        specs = {spec.name: spec for spec in box.specs()}
        assert list(specs) == ["srv__echo", "sum_two", "srv__hostile", "srv__client_caps",
                               "srv__change_tools", "srv__list_count", "bad_name"]
        echo = specs["srv__echo"]
        assert echo.description == "Echo the text back."
        assert echo.parameters["type"] == "object" and echo.parameters["required"] == ["text"]
        assert echo.parameters["properties"]["text"]["type"] == "string"
        assert set(specs["sum_two"].parameters["properties"]) == {"a", "b"}
        hostile = specs["srv__hostile"].description
        assert len(hostile) == DESCRIPTION_LIMIT and SECRET not in hostile and "***" in hostile
        assert not echo.idempotent and not echo.writes
        assert box.definitions()[0] == {"type": "function", "function": {
            "name": "srv__echo", "description": "Echo the text back.", "parameters": dict(echo.parameters)}}
        # The client declared no capability (no sampling, elicitation or roots).
        assert (await box.call("srv__client_caps", {}, call_id="c1", timeout=10)).result == "{}"
        # A server tool not in `allow` is unknown, even under its server name.
        for name in ("srv__leak", "leak", "srv__add"):
            outcome = await box.call(name, {}, call_id="c2", timeout=10)
            assert not outcome.ok and outcome.error == f"unknown tool {name!r}"
        # tools/list_changed is ignored within the attempt: same tools, listed once.
        assert (await box.call("srv__change_tools", {}, call_id="c3", timeout=10)).ok
        await asyncio.sleep(0.1)
        assert [spec.name for spec in box.specs()] == list(specs)
        assert json.loads((await box.call("srv__list_count", {}, call_id="c4", timeout=10)).result) == {"result": 1}
        assert (await box.call("bad_name", {}, call_id="c5", timeout=10)).result == "ok"  # text content

    with_box(["echo", {"name": "add", "as": "sum_two"}, "hostile", "client_caps", "change_tools",
              "list_count", {"name": "Bad-Name", "as": "bad_name"}], body)


def test_results_text_structured_image_resources_errors_redaction_and_cap() -> None:
    async def body(box: McpToolBox) -> dict[str, Any]:
        calls = {"echo": {"text": "hi"}, "add": {"a": 2, "b": 3}, "picture": {}, "mixed": {},
                 "fail": {}, "leak": {}, "big": {}}
        outcomes = {name: await box.call(f"srv__{name}", args, call_id=f"call_1_{i}", timeout=10)
                    for i, (name, args) in enumerate(calls.items(), start=1)}
        outcomes["bad_args"] = await box.call("srv__add", {"a": "x"}, call_id="c", timeout=10)
        outcomes["stderr"] = box.stderr_tail()
        outcomes["pgid"] = box.command_ref.pgid
        return outcomes

    out = with_box(["echo", "add", "picture", "mixed", "fail", "leak", "big"], body, output_limit=4096)
    assert out["echo"].ok and out["echo"].result == '{"result": "hi"}' and not out["echo"].truncated
    assert out["add"].ok and json.loads(out["add"].result) == {"sum": 5}  # structuredContent as JSON
    assert out["picture"].result == "[image/png 100 bytes omitted]"
    assert out["mixed"].result == "first\n[audio/wav 3 bytes omitted]\n[text/plain 5 bytes omitted]"
    assert not out["fail"].ok and out["fail"].result is None
    assert out["fail"].error == "Error executing tool fail: it broke near ***"
    assert out["leak"].result == '{"result": "the token is ***!"}'
    big = out["big"]
    assert big.ok and big.truncated and SECRET not in big.result and len(big.result.encode()) < 4200
    assert CUT_MARKER.format(cut=100_000 + len('{"result": ""}') + 3 - 4096) in big.result
    assert not out["bad_args"].ok and out["bad_args"].error  # the server's validation error
    for value in out.values():
        assert SECRET not in str(value)
    assert "leaking ***" in out["stderr"]
    assert live_in_group(out["pgid"]) == []


def test_stored_definitions_are_offered_without_listing_again() -> None:
    allow = ["list_count", {"name": "echo", "as": "say"}]

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, str]:
        first = await McpToolBox.open(entry(allow), redactor=Redactor([SECRET]))
        stored = first.definitions()
        await first.aclose()
        # The box is opened, used and closed from three different tasks.
        second = await asyncio.create_task(
            McpToolBox.open(entry(allow), redactor=Redactor([SECRET]), definitions=json.loads(json.dumps(stored))))
        count = await asyncio.create_task(second.call("srv__list_count", {}, call_id="c", timeout=10))
        said = await second.call("say", {"text": "again"}, call_id="d", timeout=10)
        await asyncio.create_task(second.aclose())
        return stored, second.definitions(), count.result, said.result

    stored, again, count, said = asyncio.run(main())
    assert [d["function"]["name"] for d in stored] == ["srv__list_count", "say"]
    assert again == stored
    assert count == '{"result": 0}'  # the second server was never asked for its tools
    assert said == '{"result": "again"}'


def test_a_slow_call_times_out_and_the_server_keeps_serving() -> None:
    async def body(box: McpToolBox) -> tuple[Any, float, Any]:
        started = time.monotonic()
        slow = await box.call("srv__slow", {"seconds": 30}, call_id="c1", timeout=0.5)
        waited = time.monotonic() - started
        return slow, waited, await box.call("srv__echo", {"text": "still here"}, call_id="c2", timeout=10)

    slow, waited, echo = with_box(["slow", "echo"], body)
    assert not slow.ok and slow.error == "timed out after 0.5s"
    assert 0.5 <= waited < 5.0 and 0.5 <= slow.duration_s < 5.0  # loose: a loaded machine
    assert echo.ok and echo.result == '{"result": "still here"}'


def test_stray_stdout_lines_are_skipped_and_named_when_a_call_times_out() -> None:
    async def body(box: McpToolBox) -> tuple[Any, Any]:
        noisy = await box.call("srv__noisy", {}, call_id="c1", timeout=10)
        return noisy, await box.call("srv__slow", {"seconds": 30}, call_id="c2", timeout=0.3)

    noisy, slow = with_box(["noisy", "slow"], body)
    assert noisy.ok and noisy.result == '{"result": "ok"}'
    assert slow.error == "timed out after 0.3s (the server wrote 1 stdout line(s) that were not JSON-RPC messages)"


def test_a_server_that_dies_mid_call_is_a_tool_error_then_not_running() -> None:
    async def body(box: McpToolBox) -> tuple[Any, Any]:
        crash = await box.call("srv__crash", {}, call_id="c1", timeout=10)
        return crash, await box.call("srv__echo", {"text": "x"}, call_id="c2", timeout=10)

    crash, after = with_box(["crash", "echo"], body)
    assert not crash.ok and crash.error.startswith("MCP server 'srv' exited during the call (exit code 3)")
    assert crash.error.endswith("dying with ***") and SECRET not in crash.error
    assert not after.ok and after.error.startswith("MCP server 'srv' is not running (exit code 3)")


def test_a_message_past_the_size_limit_stops_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_stdio, "MAX_MESSAGE_BYTES", 64 * 1024)  # big() answers ~100 KB

    async def body(box: McpToolBox) -> Any:
        return await box.call("srv__big", {}, call_id="c1", timeout=10)

    outcome = with_box(["big"], body)
    assert not outcome.ok
    assert outcome.error.startswith("MCP server 'srv' exited during the call (sent a message larger than 65536 bytes)")


def test_a_server_that_never_answers_initialize_hits_startup_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    hang = McpEntry.build("srv", [sys.executable, SERVER, "--hang"], {"PIDFILE": str(pidfile)}, ["echo"],
                          startup_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(McpStartError) as caught:
        asyncio.run(McpToolBox.open(hang, redactor=Redactor([])))
    assert time.monotonic() - started < 8.0  # not the 30 s default, and no hang
    assert caught.value.kind == "timeout"
    assert str(caught.value) == "MCP server 'srv' did not start within 0.5s (startup_timeout)"
    assert not alive(int(pidfile.read_text()))  # it ignored SIGTERM: killed all the same


def test_a_cancelled_start_stops_the_server(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    hang = McpEntry.build("srv", [sys.executable, SERVER, "--hang"], {"PIDFILE": str(pidfile)}, ["echo"])

    async def main() -> None:
        opening = asyncio.create_task(McpToolBox.open(hang, redactor=Redactor([])))
        while not pidfile.exists():
            await asyncio.sleep(0.02)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening

    asyncio.run(main())
    assert not alive(int(pidfile.read_text()))


def test_startup_failures_name_the_server_and_show_its_redacted_stderr() -> None:
    with pytest.raises(McpStartError) as early:
        asyncio.run(McpToolBox.open(entry(["echo"], "--exit-early"), redactor=Redactor([SECRET])))
    message = str(early.value)
    assert early.value.kind == "connection" and SECRET not in message
    assert message.startswith("MCP server 'srv' failed to start: ")
    assert "(exit code 3)" in message and message.endswith("cannot start: bad token ***")

    missing = McpEntry.build("srv", ["/nonexistent/mcp-server"], {}, ["echo"])
    with pytest.raises(McpStartError) as absent:
        asyncio.run(McpToolBox.open(missing, redactor=Redactor([])))
    assert absent.value.kind == "connection" and "/nonexistent/mcp-server" in str(absent.value)


def test_an_allowed_tool_the_server_lacks_or_cannot_name_is_a_start_error() -> None:
    with pytest.raises(McpStartError) as missing:
        with_box(["echo", "get_issue"], lambda box: asyncio.sleep(0))
    assert str(missing.value).startswith("MCP server 'srv' has no tool 'get_issue' listed in `allow` (it offers: ")
    assert "echo" in str(missing.value)
    with pytest.raises(McpStartError) as badly_named:
        with_box(["Bad-Name"], lambda box: asyncio.sleep(0))
    assert "'srv__Bad-Name', which is not a tool name" in str(badly_named.value)
    assert "allow: [{name, as}]" in str(badly_named.value)


def test_the_server_sees_only_the_base_variables_and_its_entry_env() -> None:
    parent = {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", "LANG": "C.UTF-8", "TERM": "dumb",
              "TMPDIR": "/tmp", "OPENAI_API_KEY": "sk-parent", "USER": "someone", "SHELL": "/bin/sh"}
    env = {"TOKEN": "literal-or-secret", "PLAIN": "x"}

    async def main() -> dict[str, str]:
        isolated = McpEntry.build("srv", [sys.executable, SERVER], env, ["environ"])
        box = await McpToolBox.open(isolated, redactor=Redactor([]), environ=parent)
        try:
            return json.loads((await box.call("srv__environ", {}, call_id="c", timeout=10)).result)
        finally:
            await box.aclose()

    seen = asyncio.run(main())
    marker = seen.pop("LOOPDSL_COMMAND_ID")  # process_tree's marker, as every command gets
    assert len(marker) == 24
    assert seen == {**{k: parent[k] for k in ("PATH", "HOME", "LANG", "TERM", "TMPDIR")}, **env}
    assert server_environment(env, parent) == seen


def test_aclose_kills_the_whole_group_even_when_the_server_ignores_shutdown() -> None:
    async def main() -> tuple[int, int, float]:
        box = await McpToolBox.open(entry(["spawn_child"], "--ignore-shutdown"), redactor=Redactor([SECRET]))
        child = json.loads((await box.call("srv__spawn_child", {}, call_id="c", timeout=10)).result)["result"]
        pgid = box.command_ref.pgid
        assert alive(child) and len(live_in_group(pgid)) == 2
        started = time.monotonic()
        await box.aclose()
        await box.aclose()  # idempotent
        return pgid, child, time.monotonic() - started

    pgid, child, closing = asyncio.run(main())
    assert live_in_group(pgid) == [] and not alive(child)
    assert closing < 8.0  # stdin closed, SIGTERM ignored, then SIGKILL: about 1 s


def test_rendering_of_links_blobs_and_unknown_sizes() -> None:
    import mcp.types as types  # the SDK's own result types, as a server would send them

    result = types.CallToolResult(content=[
        types.ResourceLink(type="resource_link", uri="file:///a", name="a", mimeType="text/csv", size=12),
        types.ResourceLink(type="resource_link", uri="file:///b", name="b"),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="file:///c", blob="AAECAw==", mimeType="application/zip")),
        types.ImageContent(type="image", data="", mimeType="image/gif"),
    ])
    assert render_result(result) == ("[text/csv 12 bytes omitted]\n[application/octet-stream unknown bytes omitted]\n"
                                     "[application/zip 4 bytes omitted]\n[image/gif 0 bytes omitted]")
    # A server's own words for a block are shown whole or not at all: cut short, the start of
    # a secret in them survived the redaction after (which hides whole secrets).
    secret = "S3cr3tTokenValue"
    hostile = types.CallToolResult(content=[
        types.ImageContent(type="image", data="AAAA", mimeType="image/" + "x" * 120 + secret),
        types.ImageContent(type="image", data="AAAA", mimeType="image/png; " + secret),
        types.ImageContent(type="image", data="AAAA", mimeType="image/x" + secret)])
    shown, _ = safe_output(render_result(hostile), limit=4096, redact=Redactor([secret]))
    assert shown == ("[application/octet-stream 3 bytes omitted]\n[application/octet-stream 3 bytes omitted]\n"
                     "[image/x*** 3 bytes omitted]")
    nested: list[Any] = []
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(RecursionError):  # call() turns this into a tool error, never a crash
        render_result(types.CallToolResult(content=[], structuredContent={"deep": nested}))


def test_a_cancelled_call_and_a_cancelled_close_leave_no_process() -> None:
    """The attempt's timeout cancels the agent's task mid-call, and may cancel it again while
    it closes the box: the cancellation propagates and the server's group is killed."""
    async def main() -> int:
        box = await McpToolBox.open(entry(["slow"], "--ignore-shutdown"), redactor=Redactor([SECRET]))
        pgid = box.command_ref.pgid
        calling = asyncio.create_task(box.call("srv__slow", {"seconds": 30}, call_id="c", timeout=60))
        await asyncio.sleep(0.3)
        calling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await calling
        closing = asyncio.create_task(box.aclose())
        await asyncio.sleep(0.1)  # inside the orderly shutdown (stdin closed, SIGTERM ignored)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        for _ in range(100):  # killed by the cancelled close, or by the shutdown it began
            if not live_in_group(pgid):
                break
            await asyncio.sleep(0.02)
        left = live_in_group(pgid)
        await box.aclose()  # what the attempt's finally still does
        return left

    assert asyncio.run(main()) == []
