"""How an agent's listing of a tool narrows it (DSL.md v1.1, "Untrusted text"): `paths:`
on a built-in applies to that listing only, not to the other built-ins the agent lists."""
from __future__ import annotations

import json
from pathlib import Path

from test_agent import Conversation, loop_text, run, tool_messages


def test_paths_narrow_only_the_built_in_they_are_listed_on(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "d.md").write_text("notes\n")
    calls = [("read_file", {"path": "src/m.py"}), ("read_file", {"path": "docs/d.md"}),
             ("list_files", {}), ("search_files", {"pattern": "notes"})]
    provider = Conversation(lambda turn, r: calls if turn == 1 else "ok")
    agent = ("tools: [{name: read_file, paths: ['src/**']}, list_files, {name: search_files, paths: ['docs/**']}]\n"
             "max_turns: 3")
    result = run(tmp_path, loop_text(agent), provider)
    assert result.status == "completed", result.state.error
    ok = [c["ok"] for c in result.state.results["work"]["tool_calls"]]
    assert ok == [True, False, True, True]
    contents = [m["content"] for m in tool_messages(provider.requests[1])]
    assert "outside the paths" in contents[1]
    assert "docs/d.md" in contents[2] and "src/m.py" in contents[2]  # list_files is not narrowed
    assert "docs/d.md" in contents[3] and "src/m.py" not in json.dumps(contents[3])
