"""Screenshots of every tab of `python app.py` at 1400 and 1024 px wide, for docs/ui-layout.md.

    python -m tests.ui_screenshots --out docs/screenshots/ui/after

Starts the app as a user does (`python app.py` on a free port, its outputs in a temporary folder), drives
Debian's chromium with Playwright, and writes small PNGs (downscaled, 64-colour palette): each tab as it
opens (`<width>-<tab>.png`, the whole page), the Generate tab with every accordion open
(`<width>-generate-open.png`) and after a 3-cell X/Y/Z plot (`<width>-generate-xyz.png`).
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

from PIL import Image

TABS = ("Generate", "Edit", "Inpaint", "Video", "Upscale", "History", "PNG info")
WIDTHS = (1400, 1024)
SHOT_WIDTH = 560  # pixels of a saved screenshot's width
MAX_HEIGHT = 4500  # a saved screenshot's most pixels of height (a longer page is cut)


def save_small(png: bytes, path: Path) -> None:
    """A page screenshot downscaled to SHOT_WIDTH and saved as a 64-colour PNG."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    height = round(image.height * SHOT_WIDTH / image.width)
    image = image.resize((SHOT_WIDTH, height), Image.Resampling.LANCZOS)
    if image.height > MAX_HEIGHT:
        image = image.crop((0, 0, SHOT_WIDTH, MAX_HEIGHT))
    image.quantize(64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def open_page(browser, url: str, width: int):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(url, wait_until="load")
    expect(page.locator("#status")).to_contain_text("cpu", timeout=60_000)
    return page


OPEN_CLOSED = """() => {
    let opened = 0;
    for (const label of document.querySelectorAll('.gr-accordion > button.label-wrap')) {
        const content = label.nextElementSibling;
        if (label.offsetParent !== null && content && content.style.display === 'none') { label.click(); opened++; }
    }
    return opened;
}"""


def open_accordions(page) -> None:
    """Every closed accordion of the visible tab opened (one inside another shows once its parent is open)."""
    for _ in range(3):
        if not page.evaluate(OPEN_CLOSED):
            return
        page.wait_for_timeout(500)


def shoot_tabs(page, out: Path, width: int) -> None:
    for name in TABS:
        page.get_by_role("tab", name=name, exact=True).click()
        page.wait_for_timeout(800)
        save_small(page.screenshot(full_page=True), out / f"{width}-{slug(name)}.png")


def show_section(page, name: str, accordion: bool = False) -> None:
    """A section tab of the Generate tab (the layout of issue 57); in an older one (`accordion`) the
    accordion whose label starts with `name`."""
    sections = page.locator("#generate-sections")
    if sections.count():
        sections.get_by_role("tab", name=name, exact=True).click()
    elif accordion:
        page.locator("button.label-wrap", has_text=name).first.click()
    page.wait_for_timeout(500)


def shoot_generate(page, out: Path, width: int) -> None:
    """The Generate tab with its accordions open (or its tallest section, ControlNet, shown), then after an
    X/Y/Z plot of three seeds (1 image, 4 steps)."""
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Generate", exact=True).click()
    open_accordions(page)
    show_section(page, "ControlNet")
    page.wait_for_timeout(800)
    save_small(page.screenshot(full_page=True), out / f"{width}-generate-open.png")
    print(f"{width} px: the Generate tab, all open, is {page.evaluate('document.documentElement.scrollHeight')} px tall")
    page.reload(wait_until="load")  # every part closed again but the scripts
    expect(page.locator("#status")).to_contain_text("cpu", timeout=60_000)
    show_section(page, "Scripts", accordion=True)
    page.locator("#prompt textarea").fill("a red circle on a blue background")
    for elem, value in (("num-images", "1"), ("steps", "4")):
        box = page.locator(f"#{elem} input[type=number]").locator("visible=true")
        if box.count():  # an older layout keeps the steps in a closed accordion
            box.fill(value)
            box.press("Enter")
    page.locator("#xyz-x-values textarea").fill("1, 2, 3")
    page.get_by_role("button", name="Run X/Y/Z plot").click()
    expect(page.locator("#xyz-info")).to_contain_text("3 of 3 cell(s)", timeout=240_000)
    page.wait_for_timeout(800)
    page.locator("#xyz-grid").scroll_into_view_if_needed()
    save_small(page.screenshot(), out / f"{width}-generate-xyz.png")
    print(f"{width} px: the page is {page.evaluate('document.documentElement.scrollHeight')} px tall after the plot")


def slug(name: str) -> str:
    return name.lower().replace(" ", "")


def shoot(url: str, out: Path, widths: tuple[int, ...]) -> None:
    from playwright.sync_api import sync_playwright

    from tests.test_browser import CHROMIUM, CHROMIUM_ARGS

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for width in widths:
            page = open_page(browser, url, width)
            shoot_tabs(page, out, width)
            page.close()
            page = open_page(browser, url, width)
            shoot_generate(page, out, width)
            page.close()
        browser.close()


def main(argv: list[str] | None = None) -> None:
    from tests.test_browser import app_py

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    parser.add_argument("--url", help="an app already running (default: start `python app.py`)")
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    args = parser.parse_args(argv)
    if args.url:
        shoot(args.url, args.out, tuple(args.widths))
        return
    with tempfile.TemporaryDirectory(prefix="ui-shots-") as folder, app_py(Path(folder), {}) as url:
        shoot(url, args.out, tuple(args.widths))
    print(f"{len(list(args.out.glob('*.png')))} screenshots in {args.out}")


if __name__ == "__main__":
    main()
