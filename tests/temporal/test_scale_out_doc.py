"""docs/scale-out.md runs as written against the suite's dev server.

Its bash blocks run in order in one bash process with `set -e` (as tests/test_docs_shell.py
runs the tutorials). What the page names and a test machine does not have is swapped in:
`localhost:7233` is the dev server; the cluster's and Temporal Cloud's addresses are TLS
fronts of it (tls_proxy.py), the cluster's requiring a client certificate; the page's PEM
files are certificates made for the test, and the Cloud block trusts the test's CA (Cloud's
own certificate chains to the system's roots). Background workers are stopped at the end.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_forked import loopdsl_bin

from tests.test_docs_shell import shell_blocks

from .conftest import ROOT, cli_env
from .tls_proxy import make_pki, tls_proxy

pytestmark = pytest.mark.slow
DOC = ROOT / "docs" / "scale-out.md"
KEY = "tmprl-doc-key-0d9e8f7a"


def test_the_scale_out_page_runs_against_the_dev_server(tmp_path: Path, temporal_server: str) -> None:
    pki_dir = tmp_path / "pki"
    pki_dir.mkdir()
    pki = make_pki(pki_dir)
    (tmp_path / "temporal-cloud.key").write_text(KEY)
    with tls_proxy(temporal_server, pki, require_client_cert=True) as cluster, \
            tls_proxy(temporal_server, pki, require_client_cert=False) as cloud:
        blocks = []
        for block in shell_blocks(DOC.read_text(encoding="utf-8")):
            block = (block.replace("localhost:7233", temporal_server)
                     .replace("temporal.example.internal:7233", cluster)
                     .replace("my-ns.a1b2c.tmprl.cloud:7233", cloud)
                     .replace("client.pem", str(pki.client_cert)).replace("client.key", str(pki.client_key))
                     .replace("ca.pem", str(pki.ca)).replace("temporal-cloud.key", str(tmp_path / "temporal-cloud.key")))
            if "LOOPDSL_TEMPORAL_API_KEY" in block:  # the test's CA stands in for the system's roots
                block = block.replace("unset LOOPDSL_TEMPORAL_TLS_CERT LOOPDSL_TEMPORAL_TLS_KEY LOOPDSL_TEMPORAL_TLS_CA",
                                      f"unset LOOPDSL_TEMPORAL_TLS_CERT LOOPDSL_TEMPORAL_TLS_KEY\n"
                                      f"export LOOPDSL_TEMPORAL_TLS_CA={pki.ca}")
            blocks.append(block)
        assert len(blocks) >= 7, "the page lost its tested blocks"
        env = cli_env()
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        # `loopdsl` as the page types it: this checkout's CLI (forked, tests/cli_forked.py).
        env["PATH"] = f"{loopdsl_bin()}{os.pathsep}{env['PATH']}"
        script = "set -e\ntrap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null' EXIT\n" + "\n".join(blocks) + "\n"
        done = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "recorded 'approve'" in out and "path: draft -> approve -> publish -> done" in out, out[-4000:]
    assert "ends as aborted" in out and "created Temporal schedule loopdsl/my-repo/release-note" in out
    # The runs started over mTLS and with the API key reached their checkpoint: served by the
    # workers of those namespaces, which connected the same ways.
    assert out.count("waiting at 'approve'") >= 3, out[-4000:]
    assert "(namespace team-a; TLS, client certificate)" in out
    assert "(namespace my-ns.a1b2c; TLS, API key from LOOPDSL_TEMPORAL_API_KEY)" in out
    assert KEY not in out  # the API key is never printed
