"""Real-browser tests: JupyterLab and Voila in headless Chromium (Debian's), driven by Playwright.

Without Chromium the tests skip with the reason, except under CI=true, where a missing browser
is a failure. JupyterLab runs on a free loopback port with a token, on a copy of the notebooks
(the UI never writes into the repository), with its own temporary settings.
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "tests" / "browser" / "output"  # screenshots, kept as CI artifacts
TOKEN = "ampviz-browser-test"
# Voila answers a page only once the notebook has run (the explorer app: ~10 s on an idle 2-core
# machine), so loading one may take far longer than Playwright's default 30 s under load.
VOILA_LOAD_MS = 180_000
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _missing_browser() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


@pytest.fixture(scope="session")
def browser():
    why = _missing_browser()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run under CI: {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    OUTPUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


# The ScalerLab's scale curve as plotly holds it (base64 arrays stay encoded): a string to compare.
SCALE_Y = """() => { const gd = document.querySelector('.ampviz-scaler-lab .js-plotly-plot');
    return gd && gd.data && gd.data[0] ? JSON.stringify(gd.data[0].y) : null; }"""


def press_slider(scope, slider_class: str, times: int, key: str = "ArrowRight"):
    """Move the slider with CSS class ``slider_class`` inside ``scope`` by ``times`` key presses
    (the keyboard works on ipywidgets' sliders in JupyterLab 4 and Voila); returns its handle."""
    handle = scope.locator(f".{slider_class} .noUi-handle").first
    handle.focus()
    for _ in range(times):
        handle.press(key)
    return handle


def shown_whole(page, explorer, width: int = 1400, height: int = 900) -> list:
    """On a ``width`` × ``height`` screen, scrolled to ``explorer`` (a locator of an explorer laid
    out as controls beside its figure), what is not in view at once: the explorer's height, its
    figure, its controls, a figure not beside the controls. An empty list when all is in view."""
    problems = []
    page.set_viewport_size({"width": width, "height": height})
    page.wait_for_timeout(500)  # the figure takes its width beside the column
    explorer.evaluate("(e) => e.scrollIntoView({block: 'start'})")  # as far as the page scrolls
    page.wait_for_timeout(200)
    box = explorer.bounding_box()
    if box["height"] > height or box["width"] > width:
        problems.append(f"the explorer is {box['width']:.0f} × {box['height']:.0f}")
    figure = explorer.locator(".js-plotly-plot").first.bounding_box()
    controls = explorer.locator(".ampviz-controls").first.bounding_box()
    for name, b in (("figure", figure), ("controls", controls)):
        if not (b["y"] >= -1 and b["y"] + b["height"] <= height + 1 and b["x"] >= 0 and b["x"] + b["width"] <= width):
            problems.append(f"the {name} is out of view: {b}")
    if figure["x"] < controls["x"] + controls["width"] or figure["width"] < 560:
        problems.append(f"the figure {figure} is not beside the controls {controls}")
    if figure["height"] < 400:
        problems.append(f"the figure is {figure['height']:.0f} pixels tall")
    return problems


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(notebook_dir: Path):
    """A JupyterLab server on a copy of ``notebook_dir``; yields its base URL."""
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="ampviz-lab-"))
    root = tmp / "notebooks"
    shutil.copytree(notebook_dir, root)
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR",
                 "JUPYTER_RUNTIME_DIR"):
        env[name] = str(tmp / name.lower())
    # (no "get notified about Jupyter news?" toast: the course's own settings turn it off, as a
    # learner gets them from `make lab` or Binder; test_lab checks it)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--IdentityProvider.token={TOKEN}", "--LabApp.extension_manager=readonly",
           f"--ServerApp.root_dir={root}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp / "lab.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{url}/api/status?token={TOKEN}", proc, tmp / "lab.log", "JupyterLab")
        yield url
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def voila(notebook: Path, settings: dict | None = None, server: dict | None = None):
    """Voila serving a copy of ``notebook`` as a page, on a free loopback port with a token, with
    the project's ``voila.json`` (as ``make explorer`` runs it; ``settings`` replaces some of its
    values: {section: {name: value}}); yields the page's URL (token included). ``server``, a dict,
    receives the Voila process (``server["proc"]``)."""
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="ampviz-voila-"))
    shutil.copy(notebook, tmp / notebook.name)
    config = json.loads((ROOT / "voila.json").read_text())
    for section, values in (settings or {}).items():
        config.setdefault(section, {}).update(values)
    (tmp / "voila.json").write_text(json.dumps(config))  # Voila reads voila.json from its working directory
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR"):
        env[name] = str(tmp / name.lower())
    cmd = [sys.executable, "-m", "voila", "--no-browser", "--Voila.ip=127.0.0.1", f"--port={port}",
           "--Voila.port_retries=0", f"--token={TOKEN}", str(tmp / notebook.name)]
    log = open(tmp / "voila.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    if server is not None:
        server["proc"] = proc
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{url}/voila/static/", proc, tmp / "voila.log", "Voila")
        yield f"{url}/?token={TOKEN}"
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_for(url: str, proc, log: Path, what: str) -> None:
    """Until the server answers ``url`` (any HTTP status counts: it is up)."""
    for _ in range(120):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text())
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not start within 60 s")


def _stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


def launch(playwright):
    """Debian's Chromium, headless, with the flags this machine needs."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)


@pytest.fixture(scope="session")
def lab(browser):
    """JupyterLab on a copy of the course's notebooks."""
    with jupyter_lab(ROOT / "notebooks") as url:
        yield url


def open_and_run(browser, lab, notebook: str):
    """A page with ``notebook`` opened in JupyterLab and every cell run; returns the page."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.goto(f"{lab}/lab/tree/{notebook}?reset&token={TOKEN}")
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=90_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    return page


def outputs_without_tracebacks(page) -> list:
    """Texts of rendered error/stderr outputs (should be empty)."""
    return page.evaluate("""() => Array.from(document.querySelectorAll(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], .jp-OutputArea-output.jp-mod-error'
    )).map(e => e.innerText.slice(0, 300))""")


def kernel_processes(parent_pid: int) -> list:
    """PIDs of the ipykernel processes started by the server with ``parent_pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent_pid and b"ipykernel_launcher" in cmdline:
            found.append(int(entry.name))
    return found


#: The browser-side core's modules, served to a page from a made-up origin (no server, no network).
JS_DIR = ROOT / "ampviz" / "widgets" / "js"
JS_ORIGIN = "http://ampviz.invalid"


#: In-page helpers: ``b64(typedArray)`` (its bytes as base64) and ``bytesOf(text)`` (base64 to an
#: ArrayBuffer), so that arrays cross between Python and the page exactly.
_JS_HELPERS = """() => {
  window.b64 = (t) => { const u = new Uint8Array(t.buffer, t.byteOffset, t.byteLength); let o = "";
    for (let i = 0; i < u.length; i += 0x8000) o += String.fromCharCode(...u.subarray(i, i + 0x8000)); return btoa(o); };
  window.bytesOf = (text) => { const s = atob(text); const b = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i); return b.buffer; };
}"""


def js_module_page(browser, module: str, name: str):
    """``js_page`` with ``/js/<module>.mjs`` imported as ``window[name]`` and the helpers in place."""
    page = js_page(browser)
    page.evaluate(f"async () => {{ window.{name} = await import('/js/{module}.mjs'); }}")
    page.evaluate(_JS_HELPERS)
    return page


def js_page(browser, extra: dict | None = None, html: str = "<html><body></body></html>"):
    """A page at ``JS_ORIGIN`` (its document ``html``) whose requests for ``/js/<name>.mjs`` are
    answered from ``JS_DIR``, and for a path of ``extra`` ({path: (content type, body)}) with that;
    every other request fails."""
    page = browser.new_page()

    def answer(route):
        name = route.request.url[len(JS_ORIGIN):]
        if name == "/":
            return route.fulfill(status=200, content_type="text/html", body=html)
        if extra and name in extra:
            kind, body = extra[name]
            return route.fulfill(status=200, content_type=kind, body=body)
        path = JS_DIR / name.removeprefix("/js/")
        if name.startswith("/js/") and path.is_file() and path.parent == JS_DIR:
            return route.fulfill(status=200, content_type="text/javascript", body=path.read_text())
        return route.abort()

    page.route("**/*", answer)
    page.goto(JS_ORIGIN + "/")
    return page
