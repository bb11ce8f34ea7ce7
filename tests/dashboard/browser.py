"""The dashboard served by `steersman dashboard` and opened in headless Chromium (Playwright
driving Debian's chromium): one screenshot per page once everything on it has rendered."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from steersman.control.backends.vllm_server import free_port
from tests.conftest import wait_until

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
# Rendered: the script has finished, no skeleton placeholder is left, every chart has drawn its
# SVG and every table its canvas.
RENDERED = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.dataset.testScriptState !== 'notRunning') return false;
  if (document.querySelector('[data-testid="stSkeleton"]')) return false;
  const charts = [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')];
  const tables = [...document.querySelectorAll('[data-testid="stDataFrame"]')];
  return charts.every(c => c.querySelector('svg')) && tables.every(t => t.querySelector('canvas'));
}"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def dashboard(url: str, log: Path) -> Iterator[str]:
    port = free_port()
    steersman = str(Path(sys.executable).with_name("steersman"))
    command = [steersman, "dashboard", "--db", url, "--port", str(port)]
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{base}/_stcore/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 60, "the dashboard to answer")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def screenshots(base: str, pages: list[str], out: Path) -> dict[str, dict]:
    """Open each page, wait until it rendered, screenshot it; what each page showed."""
    from playwright.sync_api import sync_playwright

    seen = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for name in pages:
                page.goto(f"{base}/?page={name}")
                page.wait_for_selector(f'h1:has-text("{name}")', timeout=60_000)
                page.wait_for_function(RENDERED, timeout=60_000)
                path = out / f"{name.lower()}.png"
                page.screenshot(path=str(path), full_page=True)
                seen[name] = {
                    "title": page.locator("h1").first.inner_text(),
                    "errors": page.locator(
                        '[data-testid="stException"], [data-testid="stAlertContentError"]'
                    ).count(),
                    "charts": page.locator('[data-testid="stVegaLiteChart"]').count(),
                    # Streamlit's development chrome, which an operator's dashboard leaves out
                    "deploy": page.locator('[data-testid="stAppDeployButton"]').count(),
                    "toolbar": page.locator('[data-testid="stToolbar"]').count(),
                    "screenshot": path,
                }
        finally:
            browser.close()
    return seen


if __name__ == "__main__":  # python -m tests.dashboard.browser DB_URL OUT_DIR: README screenshots
    import argparse
    import tempfile

    from steersman.dashboard.app import PAGES

    parser = argparse.ArgumentParser(description="Screenshot every dashboard page.")
    parser.add_argument("db")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with dashboard(args.db, Path(tempfile.mkdtemp()) / "dashboard.log") as base:
        for name, seen in screenshots(base, list(PAGES), args.out).items():
            print(name, seen["errors"], seen["screenshot"])
