"""The key a paid LLM response is stored under (the one the engine really uses)."""

from __future__ import annotations

import hashlib
import json

from loopdsl.runtime.actions.llm import request_key


def test_request_key_is_the_hash_of_the_call_position() -> None:
    key = request_key("r1", "draft", 2, 1, 0, "openai/x")
    body = {"run": "r1", "state": "draft", "visit": 2, "attempt": 1, "fallback": 0, "model": "openai/x"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert key == hashlib.sha256(canonical.encode()).hexdigest()
    assert key == request_key("r1", "draft", 2, 1, 0, "openai/x")


def test_every_position_field_changes_the_key() -> None:
    key = request_key("r1", "draft", 2, 1, 0, "openai/x")
    variants = {
        request_key("r2", "draft", 2, 1, 0, "openai/x"),
        request_key("r1", "edit", 2, 1, 0, "openai/x"),
        request_key("r1", "draft", 3, 1, 0, "openai/x"),
        request_key("r1", "draft", 2, 2, 0, "openai/x"),
        request_key("r1", "draft", 2, 1, 1, "openai/x"),
        request_key("r1", "draft", 2, 1, 0, "openai/y"),
    }
    assert key not in variants and len(variants) == 6
