"""The web UI in a real headless Chromium (Debian's `chromium`, driven by Playwright's Python
API; Playwright's own browser download is never used). The list, a run page with its
timeline, approving from the page and resuming, a hostile reply kept inert, the token.

`LOOPDSL_SCREENSHOTS=DIR` also saves the list and run page screenshots there (README's
pictures: `LOOPDSL_SCREENSHOTS=docs/images pytest tests/ui/test_ui_browser.py`).
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_support import HOSTILE, WaitingRun, cli
from playwright.sync_api import sync_playwright

pytestmark = pytest.mark.xdist_group("chromium")  # one headless Chromium, once (tests/conftest.py)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# --no-sandbox: containers lack the user namespaces Chromium's sandbox needs; the rest keep a
# headless browser from reaching the network or a GPU on a CI machine.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-extensions"]
TOKEN = "browser-test-token-0123456789"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.fail("Chromium is not installed: `apt-get install chromium` (.ci/run installs it)")
    with sync_playwright() as p:
        # launch() gives the browser a fresh temporary profile (user data dir) of its own
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    tab = context.new_page()
    tab.dialogs = []  # every alert/confirm a page opens, so a test can assert there were none
    tab.on("dialog", lambda dialog: (tab.dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    context.close()


def _screenshot(tab: Any, name: str) -> None:
    folder = os.environ.get("LOOPDSL_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        tab.locator("body").screenshot(path=str(Path(folder) / name))


def test_the_list_and_a_run_page_with_its_timeline(waiting_run: WaitingRun, serve_ui: Any, page: Any) -> None:
    later = [cli(["run", "hostile.yaml", "--script", "hostile.replies.yaml", "--store", str(waiting_run.store)],
                 waiting_run.workdir) for _ in range(2)]
    assert [done.returncode for done in later] == [4, 4]
    cli(["abort", later[0].stdout.split()[1].rstrip(":"), "--store", str(waiting_run.store)], waiting_run.workdir)
    base = serve_ui("--store", str(waiting_run.store), cwd=waiting_run.workdir)
    page.goto(base + "/")
    rows = page.locator("#runs tbody tr")
    assert rows.count() == 3
    assert rows.nth(2).locator("td").first.inner_text() == waiting_run.run_id  # newest first
    assert rows.nth(2).locator("td").nth(1).inner_text() == "hostile"
    assert [rows.nth(i).locator(".status").inner_text() for i in range(3)] == ["waiting", "aborted", "waiting"]
    _screenshot(page, "ui-runs.png")
    page.click(f"text={waiting_run.run_id}")
    assert page.url.endswith(f"/runs/{waiting_run.run_id}")
    assert page.locator(".lane-name").all_inner_texts() == ["gather", "write", "ask"]
    bars = page.locator("#timeline .bar")
    assert bars.count() == 3
    assert [bars.nth(i).get_attribute("class") for i in range(3)] == ["bar ok", "bar ok", "bar waiting"]
    assert page.locator("#gates tbody tr").all_inner_texts() == ["gather\tafter: has-facts\tpass\tpassed"]
    assert "openai/stubby" in page.locator("#llm-calls").inner_text()
    assert "write" in page.locator("#per-state").inner_text()
    assert page.locator("#spend-chart .point").count() == 3
    assert page.locator("#spend-chart .point.current").count() == 1
    _screenshot(page, "ui-run.png")


def test_a_hostile_reply_is_shown_as_text_and_never_runs(waiting_run: WaitingRun, serve_ui: Any, page: Any) -> None:
    base = serve_ui("--store", str(waiting_run.store), cwd=waiting_run.workdir)
    page.goto(f"{base}/runs/{waiting_run.run_id}")
    page.wait_for_timeout(300)  # time for an image error handler to fire, were there one
    assert page.locator("pre.reply").inner_text() == HOSTILE
    assert page.locator("details.call pre.call-reply").text_content() == HOSTILE  # the transcript, collapsed
    assert page.locator("#waiting-message").inner_text() == f"Ship {HOSTILE}?"
    assert page.locator("script").count() == 0 and page.locator("img").count() == 0
    assert page.dialogs == []
    # the static page of `show --html`, opened from disk, is just as inert
    out = waiting_run.workdir / "run.html"
    assert cli(["show", waiting_run.run_id, "--store", str(waiting_run.store), "--html", str(out)],
               waiting_run.workdir).returncode == 0
    page.goto(out.as_uri())
    page.wait_for_timeout(300)
    assert page.locator("pre.reply").inner_text() == HOSTILE
    assert page.locator("script").count() == 0 and page.locator("img").count() == 0
    assert page.dialogs == []


def test_approving_from_the_page_then_resume_completes_the_run(fresh_waiting_run: WaitingRun, serve_ui: Any,
                                                               page: Any) -> None:
    waiting_run = fresh_waiting_run
    base = serve_ui("--store", str(waiting_run.store), "--as", "alice", cwd=waiting_run.workdir)
    page.goto(f"{base}/runs/{waiting_run.run_id}")
    page.fill("textarea[name=comment]", "looks <b>fine</b>")
    page.click("button[value=approve]")
    assert page.locator("#notice").inner_text().startswith("decision recorded")
    assert "approve" in page.locator("#decisions").inner_text() and "alice" in page.locator("#decisions").inner_text()
    assert page.locator("#waiting").count() == 0  # nothing left to decide
    done = cli(["resume", waiting_run.run_id, "--store", str(waiting_run.store), "--json"], waiting_run.workdir)
    assert done.returncode == 0, done.stderr
    shown = json.loads(cli(["show", waiting_run.run_id, "--store", str(waiting_run.store), "--json"],
                           waiting_run.workdir).stdout)
    assert shown["run"]["status"] == "completed"
    assert shown["run"]["outputs"]["said"] == "approve by alice: looks <b>fine</b>"
    page.reload()
    assert page.locator("#status").inner_text() == "completed"
    assert page.locator("#decisions b").count() == 0  # the comment's markup is text


def test_off_loopback_the_browser_needs_the_token_once(waiting_run: WaitingRun, serve_ui: Any, page: Any) -> None:
    base = serve_ui("--store", str(waiting_run.store), "--host", "0.0.0.0", cwd=waiting_run.workdir,
                    LOOPDSL_UI_TOKEN=TOKEN)
    response = page.goto(base + "/")
    assert response.status == 401 and waiting_run.run_id not in page.content()
    response = page.goto(f"{base}/?token={TOKEN}")
    assert response.status == 200 and page.url == base + "/"
    page.goto(f"{base}/runs/{waiting_run.run_id}")  # the cookie carries the token now
    assert page.locator("#run-id").inner_text() == waiting_run.run_id
