"""Generic fixtures shared by the test suite."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from stub_server import StubServer


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    """An OpenAI-compatible stub on 127.0.0.1 (free port), serving only during the test."""
    server = StubServer(host="127.0.0.1", port=0).start()
    try:
        yield server
    finally:
        server.stop()
