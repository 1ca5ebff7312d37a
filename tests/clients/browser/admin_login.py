"""Headless Chromium on the admin page of a gateway whose HTTP listener has a token.

    admin_login.py --url http://127.0.0.1:PORT/ --topic T --group G --token TOKEN
                   [--reads-protected]

Loads the page. With --reads-protected the page's data needs the token, so the token
dialog must come up by itself; otherwise the page shows the topics first, and the dialog
comes up when the user clicks "empty" on group G of T (an action) and confirms it. A
wrong token is tried first (the dialog must say it was refused and ask again), then the
right one. Prints one JSON line: what the page showed at each step. The test decides
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
    p.add_argument("--token", required=True)
    p.add_argument("--reads-protected", action="store_true")
    p.add_argument("--timeout", type=float, default=20.0)
    args = p.parse_args()
    out: dict[str, Any] = {}
    topic_row = f'tr.topic[data-topic="{args.topic}"]'
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.set_default_timeout(args.timeout * 1000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            statuses: list[tuple[str, int]] = []
            page.on("response", lambda r: statuses.append((r.url.split("?")[0], r.status)))
            page.goto(args.url)
            if args.reads_protected:
                out["topics_before_token"] = page.eval_on_selector_all(
                    "tr.topic", "rows => rows.map(r => r.dataset.topic)"
                )
            else:
                page.wait_for_selector(topic_row)
                out["topics_before_token"] = page.eval_on_selector_all(
                    "tr.topic", "rows => rows.map(r => r.dataset.topic)"
                )
                group_row = f'tr.group[data-topic="{args.topic}"][data-group="{args.group}"]'
                page.click(f'{group_row} button[data-action="empty"]')
                page.click("dialog#confirm[open] #confirm-ok")  # empty asks first
            page.wait_for_selector("dialog#login[open]")
            out["dialog_title"] = page.inner_text("#login-title")
            page.fill("#login-token", args.token + "-wrong")
            page.click("#login-submit")
            page.wait_for_function(
                "() => document.querySelector('#login-error').textContent.includes('refused')"
            )
            out["refused_shown"] = page.inner_text("#login-error")
            page.fill("#login-token", args.token)
            # what the token was asked for is retried once it is accepted (the action, or
            # the first read): wait for that answer, not only for the dialog to close,
            # which can happen before the retry's response has arrived
            retried = "/admin/api/state" if args.reads_protected else "/admin/api/empty"
            with page.expect_response(lambda r: retried in r.url and r.status == 200):
                page.click("#login-submit")
            page.wait_for_selector("dialog#login", state="hidden")
            page.wait_for_selector(topic_row)
            out["topics_after_token"] = page.eval_on_selector_all(
                "tr.topic", "rows => rows.map(r => r.dataset.topic)"
            )
            out["statuses"] = sorted(set(statuses))
            out["page_errors"] = errors
        finally:
            browser.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
