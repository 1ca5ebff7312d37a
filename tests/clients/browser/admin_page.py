"""Headless Chromium (Debian's package, driven by Playwright) on the gateway's admin page.

    admin_page.py --url http://127.0.0.1:PORT/ --topic T --group G --screenshot FILE

Loads the page, waits for the row of group G of topic T, records what the page shows
(every topic and group row, that row's cells), publishes one more message over /pub and
waits for the page's own refresh to show the new depth, clicks the row's pause
button and waits until the page shows it paused, opens "peek ready" and records the
messages shown, saves a full-page screenshot, and prints one JSON line. The test decides
whether that is right.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--screenshot", required=True)
    p.add_argument("--timeout", type=float, default=20.0)
    args = p.parse_args()
    out: dict[str, Any] = {}
    row = f'tr.group[data-topic="{args.topic}"][data-group="{args.group}"]'
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(args.timeout * 1000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(args.url)
            page.wait_for_selector(row)
            out["title"] = page.title()
            out["topics"] = page.eval_on_selector_all(
                "tr.topic", "rows => rows.map(r => r.dataset.topic)"
            )
            out["groups"] = page.eval_on_selector_all(
                "tr.group", "rows => rows.map(r => [r.dataset.topic, r.dataset.group])"
            )
            out["cells"] = page.eval_on_selector(
                row,
                "r => Object.fromEntries([...r.querySelectorAll('[data-field]')]"
                ".map(c => [c.dataset.field, Number(c.textContent)]))",
            )
            out["consumers"] = page.inner_text(f"{row} td:nth-child(11)")
            out["state"] = page.inner_text("#state")
            # live: publish one more message over nsqd's HTTP API and wait for the page's
            # next refresh to show it
            base = args.url.rstrip("/")
            reply = page.request.post(f"{base}/pub?topic={args.topic}", data=b"live message")
            out["pub_status"] = reply.status
            page.wait_for_function(
                f"""() => Number(document.querySelector('{row} [data-field="depth"]')
                         .textContent) === {out["cells"]["depth"] + 1}"""
            )
            out["live_depth"] = out["cells"]["depth"] + 1
            page.click(f'{row} button[data-action="pause"]')
            page.wait_for_selector(f"{row} .paused")
            out["paused_shown"] = True
            page.click(f'{row} button[data-action="peek-ready"]')
            page.wait_for_selector("tr.peek pre[data-message]")
            out["peek"] = page.eval_on_selector_all(
                "tr.peek pre[data-message]", "ps => ps.map(p => p.textContent)"
            )
            page.screenshot(path=args.screenshot, full_page=True)
            out["page_errors"] = errors
        finally:
            browser.close()
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
