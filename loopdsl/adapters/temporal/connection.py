"""Where a Temporal server is and how to reach it: the one home of the connection options.

Every `--temporal` command (worker, run, runs, show, approve, reject, decide, abort,
schedule) takes the same options and environment variables, checked here before any
network call, so a wrong path is a clear user error rather than a TLS handshake failure.
The Temporal Cloud API key is read only from the environment (never a flag, whose value
would sit in shell history and `ps`), is never printed, and never reaches a workflow:
it authenticates the client connection only.

No `temporalio` import at module level: the CLI builds a Connection before it knows
whether the SDK is installed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...language.errors import EXIT_USAGE, LoopdslError

ADDRESS_ENV = "LOOPDSL_TEMPORAL"
NAMESPACE_ENV = "LOOPDSL_TEMPORAL_NAMESPACE"
API_KEY_ENV = "LOOPDSL_TEMPORAL_API_KEY"
TLS_ENV = {"tls_cert": "LOOPDSL_TEMPORAL_TLS_CERT", "tls_key": "LOOPDSL_TEMPORAL_TLS_KEY",
           "tls_ca": "LOOPDSL_TEMPORAL_TLS_CA"}
FLAGS = {"tls_cert": "--tls-cert", "tls_key": "--tls-key", "tls_ca": "--tls-ca"}


@dataclass(frozen=True)
class Connection:
    address: str
    namespace: str = "default"
    tls_cert: Path | None = None  # client certificate (mTLS), PEM
    tls_key: Path | None = None  # its private key, PEM
    tls_ca: Path | None = None  # the server's CA, PEM (default: the system's roots)
    tls_server_name: str | None = None
    tls: bool | None = None  # None: on when any TLS file or an API key is given
    api_key: str | None = None  # from API_KEY_ENV only

    @property
    def uses_tls(self) -> bool:
        if self.tls is not None:
            return self.tls
        return bool(self.tls_cert or self.tls_ca or self.tls_server_name or self.api_key)

    def describe(self) -> str:
        """For messages: address, namespace and how it authenticates (never the key itself)."""
        how = ["TLS" if self.uses_tls else "no TLS"]
        if self.tls_cert:
            how.append("client certificate")
        if self.api_key:
            how.append(f"API key from {API_KEY_ENV}")
        return f"{self.address} (namespace {self.namespace}; {', '.join(how)})"

    def hide(self, text: str) -> str:
        """`text` with the API key cut out (an SDK error could echo a header)."""
        return text.replace(self.api_key, "[api key]") if self.api_key else text

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `temporalio.client.Client.connect`, files read now."""
        from temporalio.service import TLSConfig  # optional dependency: only `--temporal` commands need it

        kwargs: dict[str, Any] = {"namespace": self.namespace}
        if self.uses_tls:
            kwargs["tls"] = TLSConfig(
                server_root_ca_cert=self.tls_ca.read_bytes() if self.tls_ca else None,
                client_cert=self.tls_cert.read_bytes() if self.tls_cert else None,
                client_private_key=self.tls_key.read_bytes() if self.tls_key else None,
                domain=self.tls_server_name)
        else:
            kwargs["tls"] = False
        if self.api_key:
            kwargs["api_key"] = self.api_key
        return kwargs


def _pem(flag: str, value: str | None, env_name: str) -> Path | None:
    if not value:
        return None
    path = Path(value).expanduser()
    where = f"{flag} {value}" if os.environ.get(env_name) != value else f"{env_name}={value}"
    try:
        head = path.read_bytes()[:4096]
    except FileNotFoundError:
        raise LoopdslError(f"{where}: no such file", f"give the path of a PEM file ({flag} or {env_name})",
                           exit_code=EXIT_USAGE) from None
    except OSError as exc:
        raise LoopdslError(f"{where}: cannot read it: {exc.strerror or exc}",
                           "check the path and its permissions", exit_code=EXIT_USAGE) from None
    if b"-----BEGIN" not in head:
        raise LoopdslError(f"{where}: not a PEM file (no '-----BEGIN' line)",
                           "certificates and keys are given in PEM form, as Temporal Cloud and tctl issue them",
                           exit_code=EXIT_USAGE)
    return path


def build(address: str | None, namespace: str | None, *, tls_cert: str | None = None, tls_key: str | None = None,
          tls_ca: str | None = None, tls_server_name: str | None = None, tls: bool | None = None,
          env: Mapping[str, str] | None = None) -> Connection | None:
    """The connection the options describe, None without an address; LoopdslError (exit 2)
    for options that cannot work: a missing or non-PEM file, a certificate without its key."""
    env = os.environ if env is None else env
    given = {"tls_cert": tls_cert, "tls_key": tls_key, "tls_ca": tls_ca}
    if not address:
        stray = [FLAGS[k] for k, v in given.items() if v] + (["--tls-server-name"] if tls_server_name else [])
        if stray:
            raise LoopdslError(f"{', '.join(stray)} without --temporal: there is no Temporal server to connect to",
                               f"add --temporal HOST:PORT (or set {ADDRESS_ENV})", exit_code=EXIT_USAGE)
        return None
    if bool(tls_cert) != bool(tls_key):
        raise LoopdslError("--tls-cert and --tls-key go together (mTLS needs the certificate and its private key)",
                           "give both, or neither (with --tls-ca alone the server is checked, not the client)",
                           exit_code=EXIT_USAGE)
    key = env.get(API_KEY_ENV) or None
    if tls is False and (tls_cert or tls_ca):
        raise LoopdslError("--no-tls with a TLS certificate option", "drop --no-tls, or the certificate options",
                           exit_code=EXIT_USAGE)
    return Connection(address=address, namespace=namespace or "default",
                      tls_cert=_pem("--tls-cert", tls_cert, TLS_ENV["tls_cert"]),
                      tls_key=_pem("--tls-key", tls_key, TLS_ENV["tls_key"]),
                      tls_ca=_pem("--tls-ca", tls_ca, TLS_ENV["tls_ca"]),
                      tls_server_name=tls_server_name or None, tls=tls, api_key=key)
