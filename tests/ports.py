"""A loopback port for a server a test starts in another process, which binds it later."""
from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A port free now that the kernel never hands out on its own.

    A port from `bind(0)` comes from the kernel's ephemeral range, which every other listener
    started meanwhile draws from too: a Temporal dev server takes five of them, and so do the
    stub servers, browsers and the other xdist workers' servers. One taken between our check
    and the server's own bind made a dev server fail to start while another server's internal
    gRPC service answered on its port ("unknown service ...WorkflowService": a whole group of
    tests failed). Below that range only ports that someone names explicitly are taken."""
    try:
        lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lowest_ephemeral = 32768  # Linux's default, also below the IANA range other systems use
    while True:
        port = random.randrange(10_000, lowest_ephemeral)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
