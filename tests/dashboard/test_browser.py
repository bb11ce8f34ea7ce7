"""A real browser on the real dashboard server: every page renders its title, no error block."""

from __future__ import annotations

from steersman.dashboard.app import PAGES
from tests.conftest import skip_or_fail
from tests.dashboard.browser import chromium, dashboard, screenshots


def test_every_page_in_headless_chromium(populated_url, tmp_path):
    if chromium() is None:
        skip_or_fail("no chromium: apt-get install chromium (.ci/run does)")
    with dashboard(populated_url, tmp_path / "dashboard.log") as base:
        seen = screenshots(base, list(PAGES), tmp_path)
    for name in PAGES:
        assert seen[name]["title"] == name
        assert seen[name]["errors"] == 0, name
        assert seen[name]["screenshot"].stat().st_size > 10_000
        assert seen[name]["deploy"] == 0 and seen[name]["toolbar"] == 1, name
    assert seen["Predictions"]["charts"] == 3  # predicted vs actual, errors, coverage
    assert seen["GPUs"]["charts"] == 6
