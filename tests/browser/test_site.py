"""`make site`: the course as static pages, opened from file:// in Chromium with no server and no
network. Every page loads with no request leaving file:// and no console error; every link inside
the site resolves (anchors into the guide and glossary too); lesson 06's scaler lab and lesson
00's format explorer are live in their pages, and a key press or a click redraws them with the
package's numbers; every widget that needs a kernel
says so with a Binder link to its notebook."""

import base64
import re
import sys
from urllib.parse import unquote

import numpy as np
import pytest

from ampviz.widgets import BrowserFormatExplorer, BrowserScalerLab
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import build_site  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    pages = build_site.build(out)
    return out, pages


def test_the_makefile_builds_it_with_the_tool():
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^site: .*\n\t\$\(BIN\)/python tools/build_site.py site$", text, flags=re.M)
    assert "site/" in (ROOT / ".gitignore").read_text().split()


def test_every_lesson_and_guide_has_a_page(site):
    out, pages = site
    names = {p.relative_to(out).as_posix() for p in pages}
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        assert f"notebooks/{nb.stem}.html" in names
    assert {"index.html", "TEACHING.html", "GLOSSARY.html"} <= names
    assert (out / "assets" / "plotly.min.js").stat().st_size > 1_000_000


def test_every_link_inside_the_site_resolves(site):
    out, pages = site
    ids = {}
    problems = []
    for page in pages:
        text = page.read_text()
        for url in re.findall(r'(?:href|src)="([^"]+)"', text):
            if re.match(r"^[a-z]+:", url) or url.startswith("#"):
                continue
            path, _, anchor = unquote(url).partition("#")
            target = (page.parent / path).resolve()
            if not target.is_file():
                problems.append(f"{page.name}: {url}")
                continue
            if anchor and target.suffix == ".html" and not target.parent.name == "notebooks":
                if target not in ids:
                    ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text()))
                if anchor not in ids[target]:
                    problems.append(f"{page.name}: {url} (no such anchor)")
    assert not problems, problems[:10]


def test_widgets_that_need_a_kernel_say_so_with_their_notebooks_binder_link(site):
    out, _ = site
    for name, widget in (("01_fp16_range", "RangeExplorer"), ("07_live_training", "LiveTrainer"),
                         ("11a_loss_scaling_across_ranks", "RanksLab")):
        text = (out / "notebooks" / f"{name}.html").read_text()
        assert re.search(rf'{widget} runs in a Python kernel: <a href="https://mybinder.org/v2/gh/ampviz/ampviz/HEAD'
                         rf'\?urlpath=lab/tree/notebooks/{name}.ipynb">', text), name
    assert "data-ampviz-explorer" not in (out / "notebooks" / "07_live_training.html").read_text()


def test_the_format_explorer_of_lesson_00_is_live_in_its_page(browser, site):
    out, _ = site
    page = _open(browser, (out / "notebooks" / "00_start_here.html").as_uri())
    page.wait_for_selector(".ampviz-format-figure.js-plotly-plot", timeout=60_000)
    page.locator(".ampviz-bit-0").first.click()  # the lowest mantissa bit of fp16's 0.1
    page.wait_for_function("() => JSON.parse(document.querySelector('.ampviz-format-figure').dataset.drawn).bits === 0x2e67")
    lab = BrowserFormatExplorer("fp16", value=0.1)
    lab.toggle_bit(0)
    assert lab.bits == 0x2E67
    # the package's readout as the page's HTML parser keeps it (a table gains its tbody)
    want = page.evaluate("(h) => { const d = document.createElement('div'); d.innerHTML = h; return d.innerHTML; }",
                         lab.readout_html())
    assert page.eval_on_selector(".ampviz-format-readout", "(r) => r.innerHTML") == want
    assert not page.errors
    page.close()


def _open(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.requests, page.errors = [], []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    return page


def test_every_page_loads_offline_with_no_error(browser, site):
    out, pages = site
    for p in pages:
        page = _open(browser, p.as_uri())
        mounts = p.read_text().count("data-ampviz-explorer=")
        if mounts:  # every explorer of the page drawn
            page.wait_for_function("(n) => document.querySelectorAll('[data-ampviz-explorer] .js-plotly-plot').length === n",
                                   arg=mounts, timeout=60_000)
        page.wait_for_timeout(100)
        leaving = [u for u in page.requests if not u.startswith("file://")]
        assert not leaving and not page.errors, (p.name, leaving[:3], page.errors[:3])
        page.close()


def test_the_scaler_lab_of_lesson_06_is_live_in_its_page(browser, site):
    out, _ = site
    page = _open(browser, (out / "notebooks" / "06_scaling_lab.html").as_uri())
    page.wait_for_selector(".ampviz-scaler-figure.js-plotly-plot", timeout=60_000)
    page.locator(".ampviz-scaler-strength").focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => JSON.parse(document.querySelector('.ampviz-scaler-figure').dataset.drawn).strength === 0.55")
    y = page.evaluate("() => Array.from(document.querySelector('.ampviz-scaler-figure').data[0].y)")
    # the lesson's call, at the position the key moved to
    lab = BrowserScalerLab(steps=200_000, scenario="spikes", strength=0.55, overlay=("DeepSpeed ZeRO", "Megatron"))
    want = lab.figure().to_plotly_json()["data"][0]["y"]
    if isinstance(want, dict):  # plotly's packed array
        want = np.frombuffer(base64.b64decode(want["bdata"]), want["dtype"])
    assert y == list(np.asarray(want, np.float64))
    assert not page.errors
    page.close()
