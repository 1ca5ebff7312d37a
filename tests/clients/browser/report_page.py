"""Headless Chromium (Debian's package, driven by Playwright) on a pipeline report.html.

    report_page.py --file OUT/report.html [--screenshot PNG]

Loads the page from disk, records console errors and page errors, and for every chart
(`figure[data-chart] img`) whether the image loaded and its size; the tables' names.
Prints one JSON line; the test decides whether that is right.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

CHARTS = """() => [...document.querySelectorAll("figure[data-chart]")].map(f => {
    const img = f.querySelector("img");
    return {chart: f.dataset.chart, complete: img !== null && img.complete,
            width: img ? img.naturalWidth : 0, height: img ? img.naturalHeight : 0};
})"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--file", required=True, type=Path)
    p.add_argument("--screenshot", type=Path)
    args = p.parse_args()
    out: dict[str, Any] = {"console_errors": [], "page_errors": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.set_default_timeout(20_000)
            page.on(
                "console",
                lambda m: out["console_errors"].append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda exc: out["page_errors"].append(str(exc)))
            page.goto(args.file.resolve().as_uri())
            page.wait_for_load_state("load")
            out["title"] = page.title()
            out["charts"] = page.evaluate(CHARTS)
            out["tables"] = page.eval_on_selector_all(
                "table[data-table]", "ts => ts.map(t => t.dataset.table)"
            )
            if args.screenshot:
                page.screenshot(path=args.screenshot, full_page=True)
        finally:
            browser.close()
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
