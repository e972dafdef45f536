"""`loopdsl ui`: the local web UI over a run store (needs the `loopdsl[ui]` extra)."""
from __future__ import annotations

from pathlib import Path

import click

from ..adapters.store.run_store import default_store_dir
from ..api.store_access import reading_store
from ..language.errors import LoopdslError
from .output import EXIT_USAGE, store_option


def _require_web_stack() -> None:
    try:
        # Imported here, not at the top: the web stack is an optional extra, and no other
        # command (lint, graph, validate ...) may pay for or depend on it.
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise LoopdslError(f"`loopdsl ui` needs the optional web extra, which is not installed ({exc.name} is missing)",
                           "pip install 'loopdsl[ui]'  (Starlette and uvicorn)", exit_code=EXIT_USAGE) from None


@click.command()
@store_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback requires --token.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token", envvar="LOOPDSL_UI_TOKEN",
              help="Every request must carry it (required off loopback; env LOOPDSL_UI_TOKEN).")
@click.option("--as", "as_name", help="Who decisions are recorded as (default: as `loopdsl approve` names you).")
def ui(store: str | None, host: str, port: int, token: str | None, as_name: str | None) -> None:
    """Browse runs and decide waiting ones in a local web page."""
    _require_web_stack()
    from ..ui.server import UiSettings, is_loopback, serve

    if not is_loopback(host) and not token:
        raise LoopdslError(f"binding the web UI to {host} (not loopback) lets other machines reach it, so it needs a token",
                           "pass --token TOKEN (or set LOOPDSL_UI_TOKEN), or bind --host 127.0.0.1", exit_code=EXIT_USAGE)
    if token is not None and len(token) < 16:
        raise LoopdslError("the UI token is too short to protect anything (under 16 characters)",
                           "use a long random one, e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe())'`",
                           exit_code=EXIT_USAGE)
    where = Path(store) if store else default_store_dir(Path.cwd())
    if where.exists():  # refused as `loopdsl runs` refuses it, not served as a page of errors
        with reading_store(where, Path.cwd()):
            pass
    settings = UiSettings(store=where, token=token, by=as_name)

    def ready(url: str) -> None:
        click.echo(f"loopdsl ui: runs of {where} at {url}" + (" (open it once with ?token=TOKEN)" if token else ""), err=True)
        click.echo("  Ctrl-C stops it", err=True)

    serve(settings, host, port, on_ready=ready)
