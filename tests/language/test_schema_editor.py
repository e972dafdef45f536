"""The published schemas in a real editor server: yaml-language-server over LSP.

Editors complete and explain loop files, tests and reply scripts from schemas/*.json
through a `# yaml-language-server: $schema=...` modeline. These tests start the real
server (npm package `yaml-language-server`, pinned in tests/lsp/package.json), speak
JSON-RPC to it over stdio as an editor does, and check what it offers: inside a state
only the keys valid for that kind of state, each once, and hover titles naming the key.

The server comes from tests/lsp/node_modules (`npm ci --prefix tests/lsp`, which .ci/run
does); when that is absent it is installed into a temporary folder. Without node and npm
the tests are skipped.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopdsl.language.schema import load_schema

pytestmark = pytest.mark.xdist_group("yaml-language-server")  # one language server process, once (tests/conftest.py)
REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "tests" / "lsp"
SERVER_SCRIPT = Path("node_modules") / "yaml-language-server" / "bin" / "yaml-language-server"
TIMEOUT = 60.0


def _server_script(tmp_root: Path) -> Path:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are not installed: yaml-language-server (the editors' YAML server) cannot run")
    installed = PACKAGE / SERVER_SCRIPT
    if installed.is_file():
        return installed
    for name in ("package.json", "package-lock.json"):
        shutil.copy(PACKAGE / name, tmp_root / name)
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=tmp_root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"npm ci of tests/lsp/package.json failed:\n{done.stdout}\n{done.stderr}"
    return tmp_root / SERVER_SCRIPT


class LspClient:
    """Just enough of an LSP client: requests, notifications, and answers to the
    server's own requests (it asks for its settings)."""

    def __init__(self, script: Path, root: Path) -> None:
        self.process = subprocess.Popen(["node", str(script), "--stdio"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.diagnostics: dict[str, list[dict[str, Any]]] = {}  # uri -> latest published
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        self.request("initialize", {
            "processId": os.getpid(), "rootUri": root.as_uri(),
            "capabilities": {"textDocument": {"completion": {"completionItem": {"snippetSupport": False}},
                                              "hover": {"contentFormat": ["markdown"]}}},
        })
        self.notify("initialized", {})
        self.notify("workspace/didChangeConfiguration", {"settings": {"yaml": self.settings()}})

    @staticmethod
    def settings() -> dict[str, Any]:
        return {"completion": True, "hover": True, "validate": True, "schemas": {}}

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            length = 0
            while True:
                line = stream.readline()
                if not line:
                    return
                if not line.strip():
                    break
                name, _, value = line.decode("ascii").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            self.messages.put(json.loads(stream.read(length)))

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._send({"method": method, "params": params})

    def request(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        wanted = self.next_id
        self._send({"id": wanted, "method": method, "params": params})
        while True:
            message = self.messages.get(timeout=TIMEOUT)
            if "method" in message and "id" in message:  # the server asks something
                items = message.get("params", {}).get("items", [])
                answer = [self.settings() for _ in items] if message["method"] == "workspace/configuration" else None
                self._send({"id": message["id"], "result": answer})
            elif message.get("id") == wanted:
                assert "error" not in message, message
                return message.get("result")
            elif message.get("method") == "textDocument/publishDiagnostics":
                self.diagnostics[message["params"]["uri"]] = message["params"]["diagnostics"]

    def open(self, path: Path, text: str) -> str:
        uri = path.as_uri()
        self.notify("textDocument/didOpen",
                    {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}})
        return uri

    def completion_labels(self, uri: str, line: int, character: int) -> list[str]:
        result = self.request("textDocument/completion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character}})
        items = result.get("items", []) if isinstance(result, dict) else (result or [])
        return sorted(str(item["label"]) for item in items)

    def hover(self, uri: str, line: int, character: int) -> str:
        result = self.request("textDocument/hover", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character}})
        return str(((result or {}).get("contents") or {}).get("value", ""))

    def published(self, uri: str) -> list[str]:
        """The messages of the diagnostics the server published for `uri` (it validates
        in the background: ask something until they arrive)."""
        deadline = time.monotonic() + TIMEOUT
        while uri not in self.diagnostics and time.monotonic() < deadline:
            self.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}})
            time.sleep(0.2)
        assert uri in self.diagnostics, f"no diagnostics published for {uri}"
        return [str(d["message"]) for d in self.diagnostics[uri]]

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def lsp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LspClient, Path]]:
    script = _server_script(tmp_path_factory.mktemp("lsp-install"))
    root = tmp_path_factory.mktemp("lsp-workspace")
    client = LspClient(script, root)
    try:
        yield client, root
    finally:
        client.close()


def modeline(schema: str) -> str:
    return f"# yaml-language-server: $schema={(REPO / 'schemas' / schema).as_uri()}\n"


LOOP = modeline("loop.schema.json") + """\
loopdsl: 1
name: demo
models:
  writer: {model: openai/gpt-4o-mini, max_tokens: 300}
start: draft
states:
  draft:
    llm:
      model: writer
      prompt: Write a haiku.
    next: check
    @@LLM
  check:
    shell: python -m pytest -q
    @@SHELL
  fresh:
    @@EMPTY
  done:
    end: completed
    @@END
"""


def _cursor(text: str, marker: str) -> tuple[str, int, int]:
    """The text with `marker` removed, and the (line, character) where it was."""
    before = text[: text.index(marker)]
    line = before.count("\n")
    return text.replace(marker, ""), line, len(before) - (before.rfind("\n") + 1)


def _state_keys(kind: str) -> set[str]:
    return set(load_schema()["definitions"][f"state_{kind}"]["properties"])


@pytest.mark.parametrize("marker, kind, written", [
    ("@@LLM", "llm", {"llm", "next"}),
    ("@@SHELL", "shell", {"shell"}),
    ("@@END", "end", {"end"}),
])
def test_completion_in_a_state_offers_only_its_kinds_keys_once(
    lsp: tuple[LspClient, Path], marker: str, kind: str, written: set[str]
) -> None:
    client, root = lsp
    text = LOOP
    for other in ("@@LLM", "@@SHELL", "@@EMPTY", "@@END"):
        if other != marker:
            text = text.replace(other, "")
    text, line, character = _cursor(text, marker)
    uri = client.open(root / f"{kind}.yaml", text)
    labels = client.completion_labels(uri, line, character)
    assert len(labels) == len(set(labels)), f"offered twice: {sorted({x for x in labels if labels.count(x) > 1})}"
    assert set(labels) == _state_keys(kind) - written
    actions = {"shell", "llm", "evaluate", "checkpoint", "set", "loop", "end"}
    assert not (set(labels) & (actions - {kind})), "keys of another kind of state are offered"
    if kind == "llm":
        assert {"next", "retry", "gates", "timeout"} <= set(labels) | written
        assert not {"idempotent", "with", "for_each", "output", "on_timeout"} & set(labels)
    if kind == "end":
        assert set(labels) <= {"output", "description"}


def test_a_state_without_an_action_yet_is_offered_every_action(lsp: tuple[LspClient, Path]) -> None:
    client, root = lsp
    text = LOOP.replace("@@LLM", "").replace("@@SHELL", "").replace("@@END", "")
    text, line, character = _cursor(text, "@@EMPTY")
    labels = client.completion_labels(client.open(root / "empty.yaml", text), line, character)
    assert len(labels) == len(set(labels))
    assert {"shell", "llm", "evaluate", "checkpoint", "set", "loop", "end"} <= set(labels)


def test_hover_titles_name_the_key_not_its_parent(lsp: tuple[LspClient, Path]) -> None:
    client, root = lsp
    text = LOOP.replace("@@LLM", "").replace("@@SHELL", "").replace("@@EMPTY", "").replace("@@END", "")
    uri = client.open(root / "hover.yaml", text)
    lines = text.splitlines()
    for key in ("next", "model"):
        line = next(i for i, t in enumerate(lines) if t.strip().startswith(f"{key}:") and i > 6)
        shown = client.hover(uri, line, lines[line].index(key) + 1)
        assert shown.startswith(f"#### {key}\n"), shown


def test_test_files_and_reply_scripts_complete_from_their_schemas(lsp: tuple[LspClient, Path]) -> None:
    client, root = lsp
    test_text, line, character = _cursor(modeline("test.schema.json") + (
        "loop: demo.yaml\nexpect:\n  status: completed\n  @@\n"), "@@")
    labels = client.completion_labels(client.open(root / "demo.test.yaml", test_text), line, character)
    assert set(labels) == {"path", "path_prefix", "outputs", "files", "spend", "tool_calls"}
    replies, line, character = _cursor(modeline("replies.schema.json") + (
        "draft:\n  - text: hello\n  - error: rate_limit\n    @@\n"), "@@")
    labels = client.completion_labels(client.open(root / "demo.replies.yaml", replies), line, character)
    assert set(labels) == {"message", "retry_after"}


def _with_modeline(path: Path, schema: str) -> str:
    """The file's text with its `$schema=` pointing at this repository's schemas/ copy."""
    text = path.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines(keepends=True) if "yaml-language-server:" not in line]
    return modeline(schema) + "".join(lines)


def test_the_bundled_loops_tests_and_replies_are_clean_in_the_editor(lsp: tuple[LspClient, Path]) -> None:
    client, _ = lsp
    files = sorted((REPO / "loops").glob("*.yaml")) + sorted((REPO / "loops" / "scripts").glob("*.replies.yaml"))
    uris = {}
    for path in files:
        schema = "test.schema.json" if path.name.endswith(".test.yaml") else \
            "replies.schema.json" if path.name.endswith(".replies.yaml") else "loop.schema.json"
        uris[path.name] = client.open(path, _with_modeline(path, schema))
    assert {name: client.published(uri) for name, uri in uris.items()} == {name: [] for name in uris}


def test_the_editor_flags_a_key_of_another_kind_of_state(lsp: tuple[LspClient, Path]) -> None:
    client, root = lsp
    text = modeline("loop.schema.json") + (
        "loopdsl: 1\nname: x\nstart: a\nstates:\n"
        "  a: {llm: {model: m, prompt: p}, idempotent: true, next: b}\n  b: {end: completed}\n")
    messages = client.published(client.open(root / "flagged.yaml", text))
    assert messages == ["Property idempotent is not allowed."]
