"""Headless Chromium (Debian's /usr/bin/chromium, driven by the playwright package; no browser
download) laying out a page and reporting each layout element's box from the DOM.

After the fonts and images are ready, the body units that overflow the page are removed (the last
body unit, again and again, until the rest fits; a closing reference list stays), then every ``[data-cls]`` element is
measured with ``getBoundingClientRect`` - of a Range over its contents when it is marked tight, so a
paragraph's box hugs its text rather than spanning the column. The screenshot is taken of that same
layout, so boxes and pixels agree exactly.
"""

from __future__ import annotations

import os

CHROMIUM = "/usr/bin/chromium"
# As tests/test_serving_browser.py launches it: headless, no sandbox (root in CI), nothing that phones home.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--font-render-hinting=none"]

_LAYOUT_JS = """
async () => {
  await document.fonts.ready;
  await Promise.all([...document.images].map(i => i.decode().catch(() => null)));
  const body = document.getElementById('body');
  const lim = body.getBoundingClientRect();
  const inside = r => r.left >= lim.left - 0.5 && r.right <= lim.right + 0.5 &&
                      r.top >= lim.top - 0.5 && r.bottom <= lim.bottom + 0.5;
  const fits = u => [...u.querySelectorAll('*')].concat([u]).every(e => inside(e.getBoundingClientRect()));
  // A unit taller than a column never fits; then body units go from the end (references, marked
  // .keep, stay: a page's 参考文献 closes it) until everything left lies inside the body box.
  [...body.querySelectorAll(':scope > .unit')].forEach(u => { if (u.getBoundingClientRect().height > lim.height) u.remove(); });
  for (let round = 0; round < 200; round++) {
    const units = [...body.querySelectorAll(':scope > .unit')];
    if (units.every(fits)) break;
    const body_units = units.filter(u => !u.classList.contains('keep'));
    (body_units.length ? body_units[body_units.length - 1] : units[units.length - 1]).remove();
  }
  // A section title left last in the body (its text did not fit) would head nothing: it goes too.
  for (;;) {
    const rest = [...body.querySelectorAll(':scope > .unit:not(.keep)')];
    const last = rest[rest.length - 1];
    if (!last || last.children.length !== 1 || !last.firstElementChild.matches('h2, h3')) break;
    last.remove();
  }
  const boxes = [];
  for (const el of document.querySelectorAll('[data-cls]')) {
    let r = el.getBoundingClientRect();
    if (el.dataset.tight === '1') {
      const range = document.createRange();
      range.selectNodeContents(el);
      r = range.getBoundingClientRect();
    }
    boxes.push({bid: Number(el.dataset.bid), cls: el.dataset.cls,
                box: [r.left, r.top, r.right, r.bottom]});
  }
  return boxes;
}
"""


def missing_browser_hint() -> str:
    return (f"headless Chromium is needed to lay out pages and {CHROMIUM} is absent: run `make system-deps` "
            "(it installs chromium and the CJK fonts with apt-get)")


def check_browser() -> None:
    """Raise a clear error, before any work, when Chromium or the playwright package is missing."""
    if not os.path.exists(CHROMIUM):
        raise FileNotFoundError(missing_browser_hint())
    try:
        import playwright.sync_api  # noqa: F401 - only whether it imports
    except ImportError as e:  # it comes with sampan's dev extra (`make setup-dev`)
        raise ImportError("the playwright package drives Chromium and is not installed: `pip install "
                          "'sampan[layout]'` (or 'playwright>=1.65.2') (no browser download: sampan drives "
                          f"{CHROMIUM})") from e


class PageRenderer:
    """One Chromium and one page (tab) of a fixed viewport, reused for every page rendered.

    Args:
        size: the viewport's width and height in CSS pixels (device scale 1: a CSS pixel is an image pixel).
    """

    def __init__(self, size: tuple[int, int]) -> None:
        check_browser()
        from playwright.sync_api import sync_playwright
        self.size = size
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            self._page = self._browser.new_page(viewport={"width": size[0], "height": size[1]},
                                                device_scale_factor=1)
        except Exception:
            self._playwright.stop()
            raise

    def render(self, html: str) -> tuple[bytes, list[dict], str]:
        """Lay out ``html``; returns the screenshot (PNG), the boxes ``[{"bid", "cls", "box": [x0, y0, x1, y1]}]``
        in page pixels, and the HTML as laid out (the units that did not fit removed)."""
        # set_content waits for the load event; nothing is fetched (images are data URIs, fonts local).
        self._page.set_content(html, wait_until="load")
        boxes = self._page.evaluate(_LAYOUT_JS)
        png = self._page.screenshot(type="png", full_page=False, animations="disabled", caret="hide")
        laid_out = "<!DOCTYPE html>\n" + self._page.evaluate("() => document.documentElement.outerHTML") + "\n"
        return png, boxes, laid_out

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._playwright.stop()

    def __enter__(self) -> PageRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
