"""A TLS front for the plain-text dev server, so the TLS and mTLS options run for real.

`temporal server start-dev` speaks no TLS. This proxy terminates TLS (HTTP/2 by ALPN, a
client certificate required when asked) and relays the bytes to the dev server, as a load
balancer in front of a cluster would. Certificates come from the `openssl` command.
"""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(folder: Path) -> Pki:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate, all PEM."""
    openssl = shutil.which("openssl")
    assert openssl, "the openssl command is needed to make test certificates"

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=loopdsl test CA")
    (folder / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={'localhost' if name == 'server' else 'loopdsl-worker'}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext")
    return Pki(folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "client.pem",
               folder / "client.key")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.contextmanager
def tls_proxy(upstream: str, pki: Pki, *, require_client_cert: bool) -> Iterator[str]:
    """Yields `127.0.0.1:PORT`, a TLS endpoint relaying to `upstream` (HOST:PORT)."""
    host, port = upstream.rsplit(":", 1)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.set_alpn_protocols(["h2"])
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki.ca)
    loop = asyncio.new_event_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    started = threading.Event()
    holder: list[asyncio.AbstractServer] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        holder.append(loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(10)
    # Bound by the server itself (port 0): a port chosen first and bound later may be taken between.
    listen = holder[0].sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{listen}"
    finally:
        async def shutdown() -> None:  # open relays end with the proxy, quietly
            holder[0].close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
