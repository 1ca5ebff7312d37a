"""Headless Chromium (Debian's package, driven by Playwright) on the gateway's admin page.

    admin_page.py --url http://127.0.0.1:PORT/ --topic T --group G --message TEXT
                  --screenshots DIR

In a 1366x768 window (a common laptop screen), loads the page, waits for the row of group
G of topic T, records what the page shows (every topic and group row, that row's cells)
and how it fits (the page's width against the window's, where every action button
ends; at 1280 pixels too), publishes one more message over /pub and waits for the page's
own refresh to show the new depth and the group's rate chart to draw it, clicks the
row's pause button and waits until the page shows it paused, opens "peek ready" and
records the messages shown, opens the peeked message whose line contains TEXT in the
message view (its facts, headers, body as text, then as hex), then opens T's detail view
(its groups, consumers and charts). Back on the overview: reads the node panel, filters
the topics by OTHER's name and sorts them by messages held, asks to empty G and cancels,
publishes a message to T from the page, empties G and deletes topic OTHER (each
confirmed). Saves a screenshot of each view in DIR and prints one JSON line. The test
decides whether that is right.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
WIDTH, HEIGHT = 1366, 768

# what overflows: the document against the window, and every action button's right edge
FIT = """() => ({
    scroll_width: document.documentElement.scrollWidth,
    inner_width: window.innerWidth,
    buttons: document.querySelectorAll("button[data-action]").length,
    buttons_outside: [...document.querySelectorAll("button[data-action]")]
        .filter(b => b.offsetParent !== null)
        .map(b => b.getBoundingClientRect())
        .filter(r => r.left < 0 || r.right > window.innerWidth).length,
})"""


def fit(page: Page) -> dict[str, int]:
    result: dict[str, int] = page.evaluate(FIT)
    return result


def depth(page: Page, row: str) -> int:
    return int(page.inner_text(f'{row} [data-field="depth"]'))


def confirm(page: Page, button: str) -> dict[str, str]:
    """Click `button`, read the question it asks; the caller answers it."""
    page.click(button)
    page.wait_for_selector("dialog#confirm[open]")
    return {
        "title": page.inner_text("#confirm-title"),
        "text": page.inner_text("#confirm-text"),
        "verb": page.inner_text("#confirm-ok"),
    }


def overview_actions(page: Page, args: argparse.Namespace, row: str, out: dict[str, Any]) -> None:
    shots = args.screenshots
    out["node"] = page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll("#node [data-node]")]
            .map(n => [n.dataset.node, n.querySelector("b").textContent]))"""
    )
    page.locator("#node").screenshot(path=shots / "admin-page-node.png")
    out["clients"] = page.evaluate(
        """() => [...document.querySelectorAll("#client-table tr.client")].map(r =>
            Object.fromEntries([...r.querySelectorAll("[data-field]")]
                .map(c => [c.dataset.field, c.textContent])))"""
    )
    topics = "() => [...document.querySelectorAll('#rows tr.topic')].map(r => r.dataset.topic)"
    page.fill("#filter", args.other)
    out["filtered"] = page.evaluate(topics)
    page.fill("#filter", "")
    page.select_option("#sort", "held")
    out["sorted_by_held"] = page.evaluate(topics)
    page.select_option("#sort", "name")
    out["topic_depth"] = page.inner_text(
        f'tr.topic[data-topic="{args.topic}"] [data-topic-field="depth"]'
    )
    # empty asks first, naming what goes; cancel keeps everything
    before = depth(page, row)
    out["empty_question"] = confirm(page, f'{row} button[data-action="empty"]')
    page.screenshot(path=shots / "admin-page-confirm.png")
    page.click("#confirm-cancel")
    page.wait_for_selector("dialog#confirm", state="hidden")
    out["depth_after_cancel"] = depth(page, row)
    out["depth_before"] = before
    # publish from the page
    page.click(f'tr.topic[data-topic="{args.topic}"] button[data-action="publish"]')
    page.wait_for_selector("dialog#publish[open]")
    page.fill("#publish-body", "typed in the page")
    page.click("#publish-ok")
    page.wait_for_function(
        f"""() => Number(document.querySelector('{row} [data-field="depth"]').textContent)
                 === {before + 1}"""
    )
    out["depth_after_publish"] = before + 1
    # empty, confirmed
    confirm(page, f'{row} button[data-action="empty"]')
    page.click("#confirm-ok")
    page.wait_for_function(
        f"""() => document.querySelector('{row} [data-field="depth"]').textContent === "0" """
    )
    out["emptied"] = True
    # delete a topic, confirmed
    other = f'tr.topic[data-topic="{args.other}"]'
    out["delete_question"] = confirm(page, f'{other} button[data-action="delete"]')
    page.click("#confirm-ok")
    page.wait_for_selector(other, state="detached")
    out["deleted"] = True
    out["fit_after_actions"] = fit(page)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--message", required=True, help="text in the peeked message to open")
    p.add_argument("--other", required=True, help="another topic: filtered for, then deleted")
    p.add_argument("--screenshots", required=True, type=Path)
    p.add_argument("--timeout", type=float, default=20.0)
    args = p.parse_args()
    out: dict[str, Any] = {}
    row = f'tr.group[data-topic="{args.topic}"][data-group="{args.group}"]'
    shots = args.screenshots
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.set_default_timeout(args.timeout * 1000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.goto(args.url)
            page.wait_for_selector(row)
            # the first paint: the charts hold what the gateway sampled before the page
            out["first_paint"] = page.eval_on_selector(
                f"{row} svg.chart",
                "s => ({points: Number(s.dataset.points), peak: Number(s.dataset.peak),"
                " span: Number(s.dataset.span)})",
            )
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
                ".filter(c => !['consumers', 'in_rate', 'acked_rate'].includes(c.dataset.field))"
                ".map(c => [c.dataset.field, Number(c.textContent)]))",
            )
            out["consumers"] = page.inner_text(f'{row} [data-field="consumers"]')
            out["state"] = page.inner_text("#state")
            out["fit"] = fit(page)
            page.set_viewport_size({"width": 1280, "height": 800})
            out["fit_1280"] = fit(page)
            page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
            # live: publish one more message over nsqd's HTTP API and wait for the page's
            # next refresh to show it, in the depth and in the group's chart
            base = args.url.rstrip("/")
            reply = page.request.post(f"{base}/pub?topic={args.topic}", data=b"live message")
            out["pub_status"] = reply.status
            page.wait_for_function(
                f"""() => Number(document.querySelector('{row} [data-field="depth"]')
                         .textContent) === {out["cells"]["depth"] + 1}"""
            )
            out["live_depth"] = out["cells"]["depth"] + 1
            page.wait_for_function(
                f"() => Number(document.querySelector('{row} svg.chart').dataset.peak) > 0"
            )
            out["row_chart"] = page.eval_on_selector(
                f"{row} svg.chart",
                "s => ({points: Number(s.dataset.points), peak: Number(s.dataset.peak),"
                " lines: [...s.querySelectorAll('polyline')].map(l => l.dataset.series)})",
            )
            page.click(f'{row} button[data-action="pause"]')
            page.wait_for_selector(f"{row} .paused")
            out["paused_shown"] = True
            page.click(f'{row} button[data-action="peek-ready"]')
            page.wait_for_selector("tr.peek pre[data-message]")
            out["peek"] = page.eval_on_selector_all(
                "tr.peek pre[data-message]", "ps => ps.map(p => p.textContent)"
            )
            out["fit_with_peek"] = fit(page)
            page.screenshot(path=shots / "admin-page.png")
            page.screenshot(path=shots / "admin-page-full.png", full_page=True)

            # the message view
            # pressed, held through a poll, released: the poll's redraw must not swallow
            # the click (pressed on the old row, released on its replacement)
            # where the message is, found in one script run: a poll's redraw can replace
            # the element between two calls from here (its replacement sits at the same
            # place)
            where = page.evaluate(
                """text => {
                    const box = [...document.querySelectorAll("tr.peek pre[data-message]")]
                        .find(p => p.textContent.includes(text));
                    box.scrollIntoView({block: "center"});
                    const r = box.getBoundingClientRect();
                    return {x: r.x + r.width / 2, y: r.y + r.height / 2};
                }""",
                args.message,
            )
            page.mouse.move(where["x"], where["y"])
            polls = page.evaluate("() => Number(document.body.dataset.polls || 0)")
            page.mouse.down()
            page.wait_for_function(f"() => Number(document.body.dataset.polls) > {polls}")
            page.mouse.up()
            page.wait_for_selector('dialog#message[open] #message-facts [data-field="id"]')
            out["message"] = page.evaluate(
                """() => ({
                    id: document.querySelector("dialog#message").dataset.id,
                    facts: Object.fromEntries([...document.querySelectorAll(
                        "#message-facts dd")].map(d => [d.dataset.field, d.textContent])),
                    headers: [...document.querySelectorAll("#message-headers tr")]
                        .map(r => [...r.cells].map(c => c.textContent)),
                    text: document.querySelector("#message-body").textContent,
                })"""
            )
            page.screenshot(path=shots / "admin-page-message.png")
            page.click('button[data-body-mode="hex"]')
            out["message"]["hex"] = page.inner_text("#message-body")
            out["message"]["mode"] = page.get_attribute("#message-body", "data-mode")
            page.screenshot(path=shots / "admin-page-message-hex.png")
            page.keyboard.press("Escape")
            page.wait_for_selector("dialog#message", state="hidden")

            # the topic detail view
            page.click(f'a[data-topic-link="{args.topic}"]')
            page.wait_for_selector(f'#detail[data-topic="{args.topic}"] table#consumers')
            page.wait_for_function(
                "() => [...document.querySelectorAll('#detail svg.chart')]"
                ".every(s => Number(s.dataset.points) >= 2)"
            )
            out["detail"] = page.evaluate(
                """() => ({
                    overview_hidden: document.getElementById("overview").hidden,
                    groups: [...document.querySelectorAll("#groups tr.group")]
                        .map(r => r.dataset.group),
                    consumers: [...document.querySelectorAll("#consumers tr.consumer")]
                        .map(r => Object.fromEntries([...r.querySelectorAll("[data-field]")]
                            .map(c => [c.dataset.field, c.textContent]))),
                    charts: [...document.querySelectorAll("#detail .card[data-chart]")]
                        .map(c => c.dataset.chart),
                })"""
            )
            out["detail_fit"] = fit(page)
            page.screenshot(path=shots / "admin-page-topic.png")
            page.click("a[data-back]")
            page.wait_for_selector(row)
            out["back_to_overview"] = True
            overview_actions(page, args, row, out)
            out["page_errors"] = errors
            out["console_errors"] = console
        finally:
            browser.close()
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
