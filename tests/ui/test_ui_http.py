"""`loopdsl ui` over real HTTP (a real server process), `show --html`, and what the web stack
may not touch: the token off loopback, CSRF, the run list's filters and pages, the missing
extra, and commands that must not import it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from cli_in_process import cli_in_process
from ui_support import HOSTILE, WaitingRun, cli

from loopdsl.adapters.store.run_store import RunStore
from loopdsl.api.runs import new_run_state
from loopdsl.language.model import build_loop

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0k3n-for-the-ui-tests-only"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _request(url: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if data is not None else "GET")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def _csrf(page: str) -> str:
    marker = 'name="csrf" value="'
    return page.split(marker, 1)[1].split('"', 1)[0]


def _record(store: Path, run_id: str) -> dict[str, Any]:
    with RunStore(store) as st:
        return st.load_run(run_id)


def test_without_the_token_off_loopback_every_request_is_refused(waiting_run: WaitingRun, serve_ui: Any) -> None:
    base = serve_ui("--store", str(waiting_run.store), "--host", "0.0.0.0", "--token", TOKEN, cwd=waiting_run.workdir)
    status, _, body = _request(base + "/")
    assert status == 401 and "token" in body and waiting_run.run_id not in body
    assert _request(f"{base}/runs/{waiting_run.run_id}")[0] == 401
    assert _request(base + "/", headers={"X-Loopdsl-Token": TOKEN + "x"})[0] == 401
    status, _, body = _request(base + "/", headers={"X-Loopdsl-Token": TOKEN})
    assert status == 200 and waiting_run.run_id in body
    # ?token= once: a cookie from then on, and the token leaves the address
    status, headers, _ = _request(base + "/?status=waiting&token=" + TOKEN)
    assert status == 303 and headers["location"] == "/?status=waiting"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    assert _request(base + "/", headers={"Cookie": cookie.split(";")[0]})[0] == 200


def test_without_a_token_only_loopback_host_names_are_answered(waiting_run: WaitingRun, serve_ui: Any) -> None:
    base = serve_ui("--store", str(waiting_run.store), cwd=waiting_run.workdir)
    port = base.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert _request(base + "/", headers={"Host": host})[0] == 200
    # a rebinding attack's page reaches 127.0.0.1 under its own domain name
    status, _, body = _request(base + "/", headers={"Host": f"attacker.example:{port}"})
    assert status == 403 and waiting_run.run_id not in body


def test_binding_off_loopback_without_a_token_is_a_usage_error(tmp_path: Path) -> None:
    # a real process: were the check lost, the server would serve (here: until the timeout)
    done = cli(["ui", "--store", str(tmp_path / "s"), "--host", "0.0.0.0"], tmp_path, timeout=30)
    assert done.returncode == 2 and "needs a token" in done.stderr and "hint: pass --token" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_store_that_cannot_be_read_is_refused_before_serving(tmp_path: Path) -> None:
    """As `loopdsl runs` refuses it (the UI served every page as a 500 with the store's error)."""
    broken = tmp_path / "broken"
    assert cli_in_process(["run", str(ROOT / "tests" / "data" / "durable" / "checkpoint_choices.yaml"), "--store",
                           str(broken)], tmp_path).returncode == 4
    with (broken / "cache.db").open("r+b") as db:
        db.truncate(100)  # the header, then nothing: a damaged database
    for store, said in ((Path("/dev/null"), "is a file, not a directory"), (broken, "is unreadable")):
        done = cli_in_process(["ui", "--store", str(store), "--port", "0"], tmp_path)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_port_in_use_is_a_usage_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli_in_process(["ui", "--store", str(tmp_path / "s"), "--port", str(port)], tmp_path)
    assert done.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "hint: choose another --port" in done.stderr and "Traceback" not in done.stderr


def test_custom_choices_get_one_button_each(tmp_path: Path, serve_ui: Any) -> None:
    loop = ROOT / "tests" / "data" / "durable" / "checkpoint_choices.yaml"
    store = tmp_path / "store"
    assert cli_in_process(["run", str(loop), "--store", str(store)], tmp_path).returncode == 4
    run_id = json.loads(cli_in_process(["runs", "--store", str(store), "--json"], tmp_path).stdout)[0]["run_id"]
    page = _request(f"{serve_ui('--store', str(store), cwd=tmp_path)}/runs/{run_id}")[2]
    assert [part.split('"', 1)[0] for part in page.split('name="choice" value="')[1:]] == ["ship", "hold", "scrap"]
    assert "Decide: hold" in page


def test_a_decision_without_its_csrf_token_or_from_another_origin_is_refused(waiting_run: WaitingRun,
                                                                                serve_ui: Any) -> None:
    # no --as: the decision is by whoever `loopdsl approve` would name (LOOPDSL_USER here)
    base = serve_ui("--store", str(waiting_run.store), cwd=waiting_run.workdir, LOOPDSL_USER="carol")
    url = f"{base}/runs/{waiting_run.run_id}/decide"
    # A crafted link claims a decision no one made: the notice shows only what the record says.
    assert 'id="notice"' not in _request(f"{base}/runs/{waiting_run.run_id}?decided=1")[2]
    assert _request(url, {"choice": "approve"})[0] == 403
    assert _request(url, {"choice": "approve", "csrf": "guess"})[0] == 403
    token = _csrf(_request(f"{base}/runs/{waiting_run.run_id}")[2])
    assert _request(url, {"choice": "approve", "csrf": token}, {"Origin": "http://evil.example"})[0] == 403
    assert _request(url, {"choice": "approve", "csrf": token}, {"Origin": "null"})[0] == 403
    assert _record(waiting_run.store, waiting_run.run_id)["decision"] is None
    # the same form with the page's token is recorded, as `loopdsl approve` records it
    status, headers, _ = _request(url, {"choice": "approve", "csrf": token, "comment": "ok"}, {"Origin": base})
    assert status == 303 and headers["location"] == f"/runs/{waiting_run.run_id}?decided=1"
    decision = _record(waiting_run.store, waiting_run.run_id)["decision"]
    assert decision["decision"] == "approve" and decision["comment"] == "ok" and decision["by"] == "carol"
    assert 'id="notice">decision recorded' in _request(base + headers["location"])[2]


def test_a_refused_choice_shows_the_clis_message_and_records_nothing(waiting_run: WaitingRun, serve_ui: Any) -> None:
    base = serve_ui("--store", str(waiting_run.store), "--as", "dave", cwd=waiting_run.workdir)
    token = _csrf(_request(f"{base}/runs/{waiting_run.run_id}")[2])
    status, _, body = _request(f"{base}/runs/{waiting_run.run_id}/decide", {"choice": "ship", "csrf": token})
    assert status == 409 and "&#39;ship&#39; is not a choice of checkpoint &#39;ask&#39;" in body
    assert _record(waiting_run.store, waiting_run.run_id)["decision"] is None
    assert _request(f"{base}/runs/nosuchrun")[0] == 404


def _fill(store: Path, count: int) -> list[str]:
    """`count` runs through the real store API: loops a/b alternating, every third waiting."""
    loops = {n: build_loop({"loopdsl": 1, "name": n, "start": "s", "states": {"s": {"end": "completed"}}}) for n in "ab"}
    ids = []
    with RunStore(store) as st:
        for i in range(count):
            run_id = st.new_run_id()
            state = new_run_state(loops["ab"[i % 2]], run_id, {})
            st.create_run(run_id, state.to_json())
            state.status = "waiting" if i % 3 == 0 else "completed"
            state.ledger.update(cost_usd=0.01 * i, tokens=i)
            st.commit(run_id, state.to_json(), [{"seq": 1, "t": state.started_at, "type": "start"}])
            ids.append(run_id)
    return ids


def _listed(page: str) -> list[str]:
    return [part.split('"', 1)[0] for part in page.split('<a href="/runs/')[1:]]


def test_the_list_filters_by_status_and_loop_and_pages_newest_first(tmp_path: Path, serve_ui: Any) -> None:
    store = tmp_path / "store"
    ids = _fill(store, 120)
    base = serve_ui("--store", str(store), cwd=tmp_path)
    first = _request(base + "/")[2]
    assert _listed(first) == ids[::-1][:50] and 'rel="next"' in first and 'rel="prev"' not in first
    last = _request(base + "/?offset=100")[2]
    assert _listed(last) == ids[::-1][100:] and 'rel="next"' not in last
    waiting_a = [run_id for i, run_id in enumerate(ids) if i % 3 == 0 and i % 2 == 0][::-1]
    assert _listed(_request(base + "/?status=waiting&loop=a")[2]) == waiting_a
    assert _listed(_request(base + "/?loop=nope")[2]) == []
    assert _request(base + "/?offset=banana")[0] == 200
    # The web stack's own answers (an unknown path, a wrong method) carry the headers too.
    for answer in (_request(base + "/no/such/page"), _request(base + "/", {"x": "y"})):
        assert answer[0] in (404, 405) and {"content-security-policy", "x-frame-options"} <= {k.lower() for k in answer[1]}
    # The store damaged under the running server: a message and a 500, once an internal error.
    with open(store / "cache.db", "r+b") as database:
        database.write(b"not a database" * 400)
    status, headers, text = _request(base + "/")
    assert status == 500 and "unreadable" in text and "Traceback" not in text, text
    assert "content-security-policy" in {k.lower() for k in headers}


def test_show_html_writes_the_run_page_with_the_reply_escaped(waiting_run: WaitingRun) -> None:
    out = waiting_run.workdir / "run.html"
    done = cli_in_process(["show", waiting_run.run_id, "--store", str(waiting_run.store), "--html", str(out)],
                          waiting_run.workdir)
    assert done.returncode == 0, done.stderr
    page = out.read_text(encoding="utf-8")
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    assert 'id="timeline"' in page and "Content-Security-Policy" in page
    assert 'name="csrf"' not in page  # a static file has no server to post a decision to
    assert HOSTILE not in page


PROBE = """import json, sys
from loopdsl.cli import main
for command in sys.argv[1:]:
    sys.argv[1:] = json.loads(command)
    try:
        main()
    except SystemExit:
        pass
    print(command, sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'playwright')
                          or m.startswith('loopdsl.ui')), file=sys.stderr)
"""


def test_lint_graph_and_validate_import_no_web_module(tmp_path: Path) -> None:
    # one process runs the three commands, each checked after it ran: what one of them imports
    # stays imported, so the check after each covers it and those before
    loop = ROOT / "tests" / "data" / "project" / "strong" / "loops" / "notes.yaml"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    commands = [json.dumps([name, str(loop)]) for name in ("lint", "graph", "validate")]
    done = subprocess.run([sys.executable, "-c", PROBE, *commands], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    checks = [line for line in done.stderr.splitlines() if line.startswith(tuple(commands))]
    assert checks == [f"{command} []" for command in commands], done.stderr


def test_ui_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    # None in sys.modules makes `import starlette` fail as it does where the extra is absent.
    code = "import sys; sys.modules['starlette'] = None; from loopdsl.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", code, "ui", "--store", str(tmp_path / "s")], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "needs the optional web extra" in done.stderr and "pip install 'loopdsl[ui]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_run_json_is_unchanged_by_viewing(waiting_run: WaitingRun, serve_ui: Any) -> None:
    before = json.dumps(_record(waiting_run.store, waiting_run.run_id), sort_keys=True)
    base = serve_ui("--store", str(waiting_run.store), cwd=waiting_run.workdir)
    assert _request(f"{base}/runs/{waiting_run.run_id[:4]}")[0] == 200
    assert json.dumps(_record(waiting_run.store, waiting_run.run_id), sort_keys=True) == before
