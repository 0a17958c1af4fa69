"""Real-browser tests: JupyterLab and Voila in headless Chromium (Debian's), driven by Playwright.

Without Chromium the tests skip with the reason, except under CI=true, where a missing browser
is a failure. JupyterLab runs on a free loopback port with a token, on a copy of the notebooks
(the UI never writes into the repository), with its own temporary settings.
"""

import base64
import contextlib
import functools
import json
import math
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

import nbformat
import numpy as np
import plotly
import pytest

from ampviz.widgets.jsbundle import bundle

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


# ----------------------------------------------------------------- an explorer's page, with no kernel
@functools.cache
def _plotly_js() -> str:
    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text()


def explorer_test_page(browser, view: str, width: int = 1300, **modules):
    """A page (``js_page``) with plotly, a root div ``width`` pixels wide, the view module ``view``
    bundled as ``window.V``, page_model.mjs as ``window.PM`` and each of ``modules`` ({name:
    module}) as ``window[name]`` (from ``/js/<module>.mjs``), and the in-page helpers in place; the
    page's console errors and uncaught errors collect in ``page.errors``."""
    page = js_page(browser, {"/plotly.min.js": ("text/javascript", _plotly_js()),
                             "/bundle/view.mjs": ("text/javascript", bundle(view))},
                   '<html><head><script src="/plotly.min.js"></script></head>'
                   f'<body><div id="root" style="width:{width}px"></div></body></html>')
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.evaluate("""async (modules) => { window.V = await import('/bundle/view.mjs');
        window.PM = await import('/js/page_model.mjs');
        for (const [name, module] of modules) window[name] = await import(`/js/${module}.mjs`); }""",
                  list(modules.items()))
    page.evaluate(_JS_HELPERS)
    return page


def state_of(widget) -> dict:
    """The widget's synced state, less its private (``_``) keys: what the page's model starts from."""
    return {k: v for k, v in widget.get_state().items() if not k.startswith("_")}


def load_data(page, widget) -> None:
    """The data ``widget`` ships, as the page reads it, in ``window.D`` (and an empty ``window.CACHE``)."""
    page.evaluate("(s) => { window.D = V.shippedData((k) => s[k]); window.CACHE = new Map(); }", state_of(widget))


def render(page, widget, figure: str) -> None:
    """The view drawn in the page's root div on a page model of ``widget``'s state (``window.M``),
    once its figure (CSS selector ``figure``) is drawn by plotly."""
    page.evaluate("""(s) => { const root = document.getElementById("root"); root.innerHTML = "";
        window.M = PM.pageModel(s); V.default.render({model: M, el: root}); }""", state_of(widget))
    page.wait_for_selector(f"{figure}.js-plotly-plot")


def drawn(page, figure: str, loads=json.loads) -> dict:
    """The settings the figure (CSS selector ``figure``) was last drawn at (its ``data-drawn``)."""
    return loads(page.eval_on_selector(figure, "(d) => d.dataset.drawn"))


def wait_drawn(page, figure: str, timeout: float | None = None, **want) -> None:
    """Until the figure (CSS selector ``figure``) is drawn at settings that include ``want``."""
    page.wait_for_function("""([sel, want]) => { const d = document.querySelector(sel).dataset.drawn;
        if (!d) return false; const s = JSON.parse(d); return Object.entries(want).every(([k, v]) => s[k] === v); }""",
                           arg=[figure, want], timeout=timeout)


# ----------------------------------------------------------------- figures as JSON has them
def unpack(packed: dict) -> np.ndarray:
    """plotly's packed array ({"bdata", "dtype"}, and "shape" for more than one dimension) as an array."""
    shape = [int(s) for s in str(packed.get("shape", "-1")).split(",")]
    return np.frombuffer(base64.b64decode(packed["bdata"]), packed["dtype"]).reshape(shape)


def plain(v, nan=None, inf=None):
    """A figure's value as JSON has it: arrays (plotly's packed ones too, of any shape) and tuples
    as lists, a NaN as ``nan``, an infinity as the text ``inf`` ("-" before it for -inf; with
    ``inf`` None, left as it is)."""
    if isinstance(v, np.ndarray):
        return plain(v.tolist(), nan, inf)
    if isinstance(v, dict) and set(v) >= {"bdata", "dtype"}:  # plotly's packed array
        return plain(unpack(v), nan, inf)
    if isinstance(v, dict):
        return {k: plain(x, nan, inf) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x, nan, inf) for x in v]
    if isinstance(v, float) and v != v:
        return nan
    if isinstance(v, float) and math.isinf(v) and inf is not None:
        return inf if v > 0 else "-" + inf
    return v


def python_figure(fig, nan=None, inf=None) -> dict:
    """``fig.to_plotly_json()`` as JSON has it (``plain``), less its template (compared once on its own)."""
    out = plain(fig.to_plotly_json(), nan, inf)
    out["layout"].pop("template")
    return out


def figure_dicts(fig, nan=None, inf=None) -> dict:
    """What ``python_figure`` gives, read from the figure's own trace and layout dicts: the dicts
    that ``to_plotly_json`` copies (the template too, some 10 ms a figure) and packs, in a fraction
    of the time."""
    return plain({"data": fig._data, "layout": {k: v for k, v in fig._layout.items() if k != "template"}}, nan, inf)


# ----------------------------------------------------------------- an explorer in JupyterLab, with a kernel
def python_side_cell(widget: str, names: list, show: str) -> str:
    """A notebook cell that shows what the kernel reads in an HTML widget of class ``python-side``:
    ``show`` (lines of Python that set ``python_side.value``) runs at once and whenever the traits
    ``names`` of the kernel's ``widget`` (a variable's name) change."""
    body = "".join(f"    {line}\n" for line in show.strip().splitlines())
    return ("import ipywidgets as W\npython_side = W.HTML()\npython_side.add_class(\"python-side\")\n"
            f"def show(_=None):\n{body}{widget}.observe(show, names={list(names)!r})\nshow()\npython_side\n")


def write_notebook(path: Path, cells) -> Path:
    """A notebook of the code ``cells`` written at ``path``, its kernel Python 3 (ipykernel)."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"display_name": "Python 3 (ipykernel)",
                                                           "language": "python", "name": "python3"}})
    nb.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
    nbformat.write(nb, path)
    return path


@contextlib.contextmanager
def lab_notebook_page(browser, tmp_path: Path, cells: list, figure: str, python_side_starts: str):
    """JupyterLab, with a kernel, on a notebook of the code ``cells`` (in ``tmp_path``), every cell
    run; yields the page once the figure (CSS selector ``figure``) is drawn and the ``python-side``
    widget's text starts with ``python_side_starts``; closes the page after."""
    write_notebook(tmp_path / "explorer.ipynb", cells)
    with jupyter_lab(tmp_path) as url:
        page = open_and_run(browser, url, "explorer.ipynb")
        try:
            page.wait_for_selector(f"{figure}.js-plotly-plot", timeout=120_000)
            wait_python_side(page, python_side_starts, timeout=120_000)
            yield page
        finally:
            page.close()


def wait_python_side(page, starts: str, timeout: int = 60_000) -> None:
    """Until the ``python-side`` widget's text starts with ``starts``."""
    page.wait_for_function("(s) => (document.querySelector('.python-side') || {}).innerText?.startsWith(s)",
                           arg=starts, timeout=timeout)


def python_side(page) -> list:
    """The ``python-side`` widget's text, split at " | "."""
    return page.evaluate("() => document.querySelector('.python-side').innerText").split(" | ")


def press_keys(control, times: int, key: str = "ArrowRight") -> None:
    """``times`` presses of ``key`` on ``control`` (a locator), focused first."""
    control.focus()
    for _ in range(times):
        control.press(key)
