"""The notifier port over HTTP: POSTs `notify:` events with the standard library's urllib.

urllib, not httpx: it is always there, and `lint`/`graph`/`validate` never import this
module. Each delivery runs in its own daemon thread and the caller waits for it at most
its timeout: urllib's own timeout bounds each socket operation, not the whole exchange,
so a receiver that trickles its answer byte by byte would otherwise hold the run. A
thread left behind is a daemon and dies with the process.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from ..runtime.ports import Delivery

# A receiver's answer is read (so the connection ends cleanly) but never kept or shown whole.
_ANSWER_LIMIT = 4096


def _post(delivery: Delivery, results: list[str | None], index: int) -> None:
    import urllib.error
    import urllib.request

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        # A redirect would re-send (or drop) the event somewhere the loop never named.
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    request = urllib.request.Request(delivery.url, data=delivery.body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "loopdsl"})
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=delivery.timeout) as answer:
            answer.read(_ANSWER_LIMIT)
            status = answer.status
        results[index] = None if 200 <= status < 300 else f"HTTP {status}"
    except urllib.error.HTTPError as exc:
        results[index] = f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        results[index] = str(exc.reason)[:300]
    except Exception as exc:  # any failure is the delivery's, never the run's
        results[index] = f"{type(exc).__name__}: {exc}"[:300]


class WebhookNotifier:
    """POSTs each delivery's JSON body; a 2xx answer is a success."""

    def send(self, deliveries: Sequence[Delivery]) -> list[str | None]:
        import urllib.request  # noqa: F401  (imported here, before the clock starts, not inside a thread's timeout)

        results: list[str | None] = ["not sent"] * len(deliveries)
        threads = []
        started = time.monotonic()
        for index, delivery in enumerate(deliveries):
            thread = threading.Thread(target=_post, args=(delivery, results, index), daemon=True,
                                      name=f"loopdsl-notify-{index}")
            thread.start()
            threads.append(thread)
        for thread, delivery in zip(threads, deliveries):
            thread.join(max(0.0, started + delivery.timeout - time.monotonic()))
        return [f"no answer within {d.timeout:g}s" if t.is_alive() else results[i]
                for i, (t, d) in enumerate(zip(threads, deliveries))]
