"""The report page in headless Chromium (Debian's ``chromium``, on the test package list of
scripts/system_packages.sh): it loads with no script or console error, and a screenshot of it is not blank.
Each check is shown to fail on a page that breaks it (a throwing script, an empty page)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from PIL import Image

from hpc.report import write_report
from tests.unit.test_report import _run_with_rollouts

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0", "--hide-scrollbars"]


def _chromium(tmp: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed: run scripts/system_packages.sh test as root (Debian package chromium)"
    cmd = [exe, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args, page.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                         env={**os.environ, "HOME": str(tmp)}, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def _status(tmp: Path, page: Path) -> tuple[dict[str, str], str]:
    """The attributes of #page-status after load (the page's error hook), and Chromium's log."""
    out = _chromium(tmp, page, "--virtual-time-budget=3000", "--dump-dom")
    tag = re.search(r'<div id="page-status"([^>]*)>([^<]*)</div>', out.stdout)
    assert tag, out.stdout[-1000:]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag.group(1)))
    return {**attrs, "text": tag.group(2)}, out.stderr


def test_page_loads_without_script_or_console_errors(tmp_path: Path) -> None:
    page = write_report(_run_with_rollouts(tmp_path / "run").root)
    status, log = _status(tmp_path, page)
    assert status.get("data-loaded") == "1" and status.get("data-errors") == "0", status
    assert "Uncaught" not in log and "CONSOLE" not in log, log[-2000:]
    # the same check on a page with a throwing script and a console.error reports both
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("</body>", "<script>console.error('boom');noSuchFunction();</script></body>"))
    status, log = _status(tmp_path, broken)
    assert status.get("data-errors") == "2" and "noSuchFunction" in status["text"], status
    assert "Uncaught ReferenceError" in log and '"boom"' in log, log[-2000:]  # Chromium's own console log


def _variety(png: Path) -> tuple[int, float]:
    """(distinct colours, fraction of pixels that are not the background colour) of a screenshot."""
    img = Image.open(png).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 24) or []
    background = max(colours)[0] if colours else 0
    return len(colours), 1.0 - background / (img.width * img.height)


def test_screenshot_is_not_blank(tmp_path: Path) -> None:
    page = write_report(_run_with_rollouts(tmp_path / "run").root)
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,2000")
    assert Image.open(shot).size == (1280, 2000)
    colours, inked = _variety(shot)
    assert colours > 200 and inked > 0.05, (colours, inked)
    empty = tmp_path / "empty.html"
    empty.write_text("<!doctype html><html><body></body></html>")
    _chromium(tmp_path, empty, f"--screenshot={tmp_path / 'empty.png'}", "--window-size=1280,2000")
    colours, inked = _variety(tmp_path / "empty.png")
    assert colours <= 2 and inked < 0.001, (colours, inked)
