"""``analyze --html``: a self-contained page, opened in a real headless browser (Debian's chromium) and
screenshotted, from a real public run; the page fetches nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SHARED

pytest.importorskip("matplotlib")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RUN = SHARED / "real-runs" / "sunshine_grpo_rho1.00_qwen2.5-7b.trainer_state.json"
# Launch flags for this machine's closed network (no background connections, no first-run, no GPU).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _page(tmp_path):
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(RUN), "--html", str(out),
                           "--gpu-hour-price", "2.5", "--devices", "8"],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 1, done.stderr  # the run has critical findings
    return out


@pytest.mark.skipif(not RUN.is_file(), reason="../shared/real-runs is not here")
def test_the_page_holds_everything_and_fetches_nothing(tmp_path):
    from grpo_monitor.analysis.html_report import FETCHING

    text = _page(tmp_path).read_text(encoding="utf-8")
    assert FETCHING.search(text) is None
    assert text.count("<svg") == 1 and "verdict: CRITICAL" in text
    for part in ("degenerate_long_cot", "GRPOConfig(..., loss_type=&#x27;dapo&#x27;", "Looks odd but is normal",
                 "cost to the end of the run", "Recommended changes"):
        assert part in text, part


@pytest.mark.skipif(not RUN.is_file(), reason="../shared/real-runs is not here")
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs Debian's package)")
def test_headless_chromium_renders_the_report_of_a_real_run(tmp_path):
    from PIL import Image

    page = _page(tmp_path)
    shot = tmp_path / "report.png"
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1800",
                           f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    if os.environ.get("GRPO_MONITOR_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["GRPO_MONITOR_KEEP_SCREENSHOT"])
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 1800)
    px = img.load()
    w, h = img.size

    def share(pred, top, bottom):
        hits = sum(1 for y in range(top, bottom, 3) for x in range(0, w, 3) if pred(px[x, y]))
        return hits / (((bottom - top) // 3) * (w // 3))

    def near(rgb, ref, tol=40):
        return all(abs(a - b) <= tol for a, b in zip(rgb, ref))

    # The red verdict badge near the top, the blue curves of the SVG and the severity lines below it: drawn
    # pixels, not markup.
    assert share(lambda c: near(c, (0xdc, 0x26, 0x26)), 0, 300) > 0.002
    assert share(lambda c: near(c, (0x25, 0x63, 0xeb)), 300, 1200) > 0.002
    assert share(lambda c: near(c, (0xd9, 0x77, 0x06)), 300, 1200) > 0.0005
    # Mostly white page with text on it, not a blank or an error page.
    assert 0.6 < share(lambda c: c == (255, 255, 255), 0, h) < 0.98
