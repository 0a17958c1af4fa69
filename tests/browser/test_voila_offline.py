"""The explorer app works offline (a classroom or a Binder without internet): its Voila page asks
for nothing but what its own server serves, and still shows the app. Any request for another
machine is refused here, as a network without internet would, and recorded: the test fails if
there is one. No timings are asserted (bench/bench_voila_open.py measures them)."""

from urllib.parse import urlparse

from conftest import OUTPUT, ROOT, VOILA_LOAD_MS, voila

LOCAL_HOSTS = {"127.0.0.1", "localhost"}

# Every resource the page refers to (stylesheets, scripts, images, fonts' stylesheets): none may
# point to another machine, even one not fetched yet (e.g. a script imported later).
REFERENCED = """() => Array.from(document.querySelectorAll('link[href], script[src], img[src], iframe[src]'))
    .map(e => e.href || e.src)"""

# plotly.js as the page's template loads it (from its own static folder, installed with it): the
# HTTP status of each such request.
PAGE_PLOTLY = """() => performance.getEntriesByType('resource')
    .filter(e => new URL(e.name).pathname.endsWith('/static/plotly.min.js')).map(e => e.responseStatus)"""

# Font Awesome, which draws the widgets' button icons: loaded from Voila's own files, not a CDN.
ICON_FONT = """async () => { await document.fonts.ready;
    return Array.from(document.fonts).some(f => /Font Awesome 5 Free/.test(f.family) && f.status === 'loaded'); }"""


def _outside(url: str) -> bool:
    return urlparse(url).scheme in ("http", "https", "ws", "wss") and urlparse(url).hostname not in LOCAL_HOSTS


def test_the_explorer_app_needs_nothing_from_outside(browser):
    with voila(ROOT / "notebooks" / "explorer.ipynb") as url:
        context = browser.new_context(viewport={"width": 1300, "height": 1000})
        outside = []
        context.on("request", lambda request: outside.append(request.url) if _outside(request.url) else None)
        context.route(_outside, lambda route: route.abort("internetdisconnected"))
        page = context.new_page()
        try:
            page.goto(url, timeout=VOILA_LOAD_MS)
            # the app shows up: its intro, then the Formats tab's figure
            intro = page.locator(".ampviz-explorer-app .ampviz-explorer-intro")
            intro.wait_for(timeout=120_000)
            assert "click bits or type a number" in intro.inner_text()
            page.locator(".ampviz-format-explorer .js-plotly-plot").wait_for(timeout=120_000)
            assert page.evaluate("() => document.querySelector('.ampviz-format-explorer .js-plotly-plot')"
                                 ".data.length") > 0
            page.screenshot(path=str(OUTPUT / "voila_offline_formats.png"))
            # plotly.js came with the page, from its server (the template's copy; the figures do not
            # wait for the kernel to send it)
            assert page.evaluate(PAGE_PLOTLY) == [200], \
                "the page template's static/plotly.min.js was not served: install the template as `make explorer` does"
            assert page.evaluate("() => typeof window.Plotly.react") == "function"
            # the tabs built in the background arrive too; the live tab's button icons are drawn
            page.get_by_role("tab", name="Live training").click()
            page.locator(".ampviz-live-trainer .js-plotly-plot").wait_for(timeout=120_000)
            page.locator(".ampviz-live-start i.fa-play").wait_for(timeout=30_000)
            assert page.evaluate(ICON_FONT), "the icon font (Font Awesome 5) was not loaded"
            page.locator(".ampviz-live-trainer").screenshot(path=str(OUTPUT / "voila_offline_live.png"))
            page.get_by_role("tab", name="Ranges").click()
            page.locator(".ampviz-range-explorer .js-plotly-plot").wait_for(timeout=120_000)
            assert "⚠" not in page.locator("body").inner_text()
            assert [u for u in page.evaluate(REFERENCED) if _outside(u)] == []
        finally:
            page.close()
            context.close()
    assert outside == [], f"the page asked another machine for {len(outside)} resources: {outside[:5]}"
