"""The report in a real browser: headless Chromium loads a file's page and a batch's summary,
and must find every player playable (its MP3 decoded: a duration, no error) and every picture
decoded (a width and height); its screenshot of the page must not be blank.

Chromium comes from Debian (`make test` installs it, as root, where it is missing). Without it
the test is skipped, saying so, except where SPEECHLENS_REQUIRE_BROWSER is set (CI's .ci/run):
there it fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.reliability import invoke, make_audio
from tests.test_score import needs_extra

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
#: The cheapest length to score: DNSMOS repeats it to 10 s, one 9.01-s segment.
SECONDS = 5
#: Added to a copy of the page: once it has loaded, what the browser made of its players and
#: pictures, as JSON in a <pre> that --dump-dom prints.
CHECK = """<script>
window.addEventListener("load", async () => {
  const players = [...document.querySelectorAll("audio")];
  await Promise.all(players.map(player => player.readyState >= 1 ? null : new Promise(done => {
    player.addEventListener("loadedmetadata", done);
    player.addEventListener("error", done);
  })));
  const found = {
    players: players.map(p => ({duration: p.duration, error: p.error && p.error.code})),
    pictures: [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])};
  const out = document.createElement("pre");
  out.id = "speechlens-check";
  out.textContent = JSON.stringify(found);
  document.body.append(out);
});
</script>"""


def _browser() -> str:
    found = next(filter(None, map(shutil.which, BROWSERS)), None)
    if found is None:
        message = ("no Chromium here (make test installs Debian's chromium with apt-get when run "
                   "as root)")
        if os.environ.get("SPEECHLENS_REQUIRE_BROWSER"):
            pytest.fail(f"{message}, and SPEECHLENS_REQUIRE_BROWSER is set")
        pytest.skip(message)
    return found


def _chromium(browser: str, profile: Path, *args) -> str:
    """Headless, with a profile of its own; root needs --no-sandbox."""
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--virtual-time-budget=10000", *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _rendered(browser: str, page: Path, tmp_path: Path) -> dict:
    checked = tmp_path / f"checked-{page.name}"
    checked.write_text(page.read_text().replace("</body>", CHECK + "</body>"))
    dom = _chromium(browser, tmp_path / "profile", "--dump-dom", checked.as_uri())
    found = re.search(r'<pre id="speechlens-check">([^<]*)</pre>', dom)
    assert found, dom[-2000:]
    return json.loads(found.group(1))


def _not_blank(browser: str, page: Path, tmp_path: Path) -> None:
    from matplotlib.image import imread  # the report extra's

    shot = tmp_path / f"{page.stem}.png"
    _chromium(browser, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1000,1400",
              page.as_uri())
    pixels = imread(shot)[..., :3]
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200 and pixels.std() > 0.05


@needs_extra
def test_the_report_plays_and_shows_in_chromium(tmp_path, tiny_checkpoint, on_cpu):
    browser = _browser()
    for seed in range(2):
        make_audio(tmp_path / "in" / f"take{seed}.wav", SECONDS * 16000, rate=16000, seed=seed)
    folder = tmp_path / "report"
    result = invoke("enhance", tmp_path / "in", tmp_path / "out", "--report", folder,
                    "--model", tiny_checkpoint, "--device", "cpu")
    assert result.exit_code == 0, result.output
    summary = folder / "index.html"
    [page, *_] = sorted(folder.glob("take*.html"))
    shown = _rendered(browser, page, tmp_path)
    assert len(shown["players"]) == 3
    for player in shown["players"]:
        assert player["error"] is None and player["duration"] == pytest.approx(SECONDS, abs=0.1)
    assert shown["pictures"] == [[True, 1000, 800]]
    assert _rendered(browser, summary, tmp_path) == {"players": [],
                                                     "pictures": [[True, 1000, 550]]}
    _not_blank(browser, page, tmp_path)
    _not_blank(browser, summary, tmp_path)
