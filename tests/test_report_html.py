"""The HTML report page: self-contained, escaped, and rendered by a real headless Chromium
(Debian's package; ``make test`` installs it) — no console errors, every image decoded, and a
screenshot of the right size that is not blank."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import fxplan
from fxplan.plan_context import plan_context, simulate_plan
from fxplan.report.html import render_html

MODEL = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256"
CLUSTER = "local-cpu:devices=4"
WIDTH, HEIGHT = 1280, 2400


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[str, Path]:
    plan = fxplan.search(MODEL, CLUSTER, batch=64, progress=False,
                         constraints={"pp": 2, "microbatch_size": 1})
    plan = dataclasses.replace(plan, fallbacks=plan.fallbacks + (
        "<script>alert('x')</script> & a fallback",))
    graph, cluster = plan_context(plan)
    text = render_html(plan, graph, simulate_plan(plan, graph, cluster))
    path = tmp_path_factory.mktemp("html") / "plan.html"
    path.write_text(text, encoding="utf-8")
    return text, path


def test_page_is_self_contained_and_escaped(page):
    text, _ = page
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", text), "a network reference"
    assert "<link" not in text and "<script src" not in text
    assert len(re.findall(r"<img [^>]*src='data:image/png;base64,", text)) == 2
    assert "<script>alert" not in text and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp;" in text
    for section in ("summary", "memory", "timeline", "layers", "runners-up", "pruned", "fallbacks"):
        assert f"<section id='{section}'>" in text
    # per-layer rows: the four layers and the embedding/head segments
    for label in ("pre", "layer 0", "layer 3", "post"):
        assert f"<td class='l'>{label}</td>" in text


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed on CI (`make test` installs it with apt-get)")
        pytest.skip("chromium not installed (`make test` installs Debian's package with apt-get; "
                    "apt-get was unavailable or failed)")
    return found


def _run_chromium(browser: str, url: str, *extra: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *extra, url],
        capture_output=True, text=True, timeout=120)


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.browser
def test_console_errors_are_detected(tmp_path):
    """The detector sees a page's console error (so the check below can fail)."""
    browser = _chromium()
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); undefinedName();</script></body></html>")
    done = _run_chromium(browser, bad.as_uri(), "--dump-dom", tmp=tmp_path)
    assert any("boom" in line or "undefinedName" in line for line in _console_lines(done.stderr)), \
        done.stderr[-2000:]


@pytest.mark.browser
def test_page_renders_in_chromium_with_images_and_no_console_errors(page, tmp_path):
    from PIL import Image, ImageStat

    browser = _chromium()
    _, path = page
    dom = _run_chromium(browser, path.as_uri(), "--dump-dom", tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console_lines(dom.stderr) == []
    check = re.search(r"id=\"selfcheck\"[^>]*>", dom.stdout)
    assert check, dom.stdout[-2000:]
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', check.group(0)))
    assert attrs["images"] == "2" and attrs["decoded"] == "2", attrs
    assert all(int(w) > 300 for w in attrs["widths"].split(","))
    shot = tmp_path / "shot.png"
    done = _run_chromium(browser, path.as_uri(), f"--screenshot={shot}",
                         f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars", tmp=tmp_path)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    image = Image.open(shot).convert("L")
    assert image.size == (WIDTH, HEIGHT)
    assert ImageStat.Stat(image).stddev[0] > 20          # not blank
    dark = sum(image.histogram()[:160]) / (WIDTH * HEIGHT)
    assert dark > 0.01                                    # text and plots drawn
    if os.environ.get("FXPLAN_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["FXPLAN_KEEP_SCREENSHOT"])
