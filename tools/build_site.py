"""Build the course as a static site: ``make site`` (or ``python tools/build_site.py [OUT]``).

Every notebook becomes a page with its code, its text and the outputs it stores (the checked
ones); an explorer that computes in the page (``ampviz.widgets.browser_*``) is live where the
lesson shows it, with its settings from the lesson's cell; a widget that needs a kernel gets a
line saying so and a Binder link for that notebook. The README (as ``index.html``), the teachers'
guide, the glossary and the package's READMEs become pages too, and links between them are
rewritten to the pages. plotly.js, the explorers' code and the style sheet are files beside the
pages: the site opens from ``file://`` or any static host, offline.
"""

from __future__ import annotations

import argparse
import ast
import html
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "site"
BINDER = "https://mybinder.org/v2/gh/ampviz/ampviz/HEAD?urlpath=lab/tree/notebooks/{name}"
SOURCE = "https://github.com/ampviz/ampviz/blob/HEAD/{path}"

#: Kernel explorers that have a page version: the lesson's call, with the same arguments, makes it.
def _page_explorers() -> dict:
    from ampviz.widgets import (BrowserBlockExplorer, BrowserFormatExplorer, BrowserFp8ScalingLab, BrowserRangeExplorer,
                                BrowserScalerLab)

    return {"BlockExplorer": BrowserBlockExplorer, "BrowserBlockExplorer": BrowserBlockExplorer,
            "ScalerLab": BrowserScalerLab, "BrowserScalerLab": BrowserScalerLab,
            "FormatExplorer": BrowserFormatExplorer, "BrowserFormatExplorer": BrowserFormatExplorer,
            "Fp8ScalingLab": BrowserFp8ScalingLab, "BrowserFp8ScalingLab": BrowserFp8ScalingLab,
            "BrowserRangeExplorer": BrowserRangeExplorer}


#: The explorer app's tabs that have a page version, and how the site's explorer page makes it
#: (the app's own ScalerLab runs a million steps: 8 MB of draws for a page, so 100,000 here).
def _app_tabs() -> dict:
    from ampviz.widgets import (BrowserBlockExplorer, BrowserFormatExplorer, BrowserFp8ScalingLab, BrowserRangeExplorer,
                                BrowserScalerLab)
    from ampviz.widgets.app import _course_gradients

    return {"Formats": lambda: BrowserFormatExplorer("fp16", value=0.1),
            # the app's: the course model's gradients (notebook 02's), up to 2^36
            "Ranges": lambda: BrowserRangeExplorer(_course_gradients(0), fmt="fp16", log2_scale=0,
                                                   log2_scale_range=(-16, 36)),
            "Loss scaling": lambda: BrowserScalerLab(steps=100_000, scenario="spikes", strength=0.5),
            "FP8 scaling": lambda: BrowserFp8ScalingLab(history_len=16, seed=0),
            "Block scaling": lambda: BrowserBlockExplorer("fp4_e2m1", seed=0)}


def _kernel_widgets() -> set:
    import ampviz.widgets as widgets

    return {n for n in widgets.__all__ if n[0].isupper()}


CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", "Noto Sans", "Noto Sans CJK SC", sans-serif;
       color: #1f2328; margin: 0; }
main { max-width: 1400px; margin: 0 auto; padding: 16px 24px 64px; }
nav { background: #f6f8fa; border-bottom: 1px solid #d0d7de; padding: 8px 24px; }
nav a { margin-right: 16px; }
a { color: #0969da; }
pre, code { font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: #f6f8fa; padding: 8px 12px; overflow-x: auto; border-radius: 6px; }
table { border-collapse: collapse; }
.rendered_html table td, .rendered_html table th, .md table td, .md table th { border: 1px solid #d0d7de; padding: 4px 8px; }
.prompt { display: none; }
.cell { margin: 12px 0; }
.output_area pre { background: #fff; border-left: 3px solid #d0d7de; }
.ampviz-kernel-note { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; padding: 8px 12px; }
.ampviz-live-note { color: #57606a; font-size: 13px; margin: 4px 0; }
.ampviz-site-banner { background: #ddf4ff; border: 1px solid #54aeff; border-radius: 6px; padding: 8px 12px; }
"""


# ----- links -----
def _slug(text: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    plain = re.sub(r"<[^>]+>", "", html.unescape(text)).strip().lower()
    return re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")


def _rewrite_links(text: str, page: Path, out: Path, pages: dict) -> str:
    """Relative links of the page at ``page`` (its source's path in the repository): to a page of
    the site when the target has one, else to the file on GitHub; external links as they are."""
    def fix(m: re.Match) -> str:
        attr, url = m.group(1), html.unescape(m.group(2))
        if re.match(r"^[a-z][a-z0-9+.-]*:", url) or url.startswith("#") or url.startswith("//"):
            return m.group(0)
        path, _, anchor = url.partition("#")
        target = (page.parent / path).resolve()
        try:
            rel = target.relative_to(ROOT)
        except ValueError:
            return m.group(0)
        if rel in pages:
            here = (out / pages[page.resolve().relative_to(ROOT)]).parent
            href = Path(_relpath(out / pages[rel], here)).as_posix()
        else:
            href = SOURCE.format(path=rel.as_posix())
        return f'{attr}="{html.escape(href + ("#" + anchor if anchor else ""))}"'
    return re.sub(r'\b(href|src)="([^"]*)"', fix, _no_remote_images(text))


def _no_remote_images(text: str) -> str:
    """An image from the web (a badge) as its alt text: the site requests nothing beyond itself."""
    def alt(m: re.Match) -> str:
        found = re.search(r'\balt="([^"]*)"', m.group(0))
        return found.group(1) if found else ""
    return re.sub(r'<img\b[^>]*\bsrc="(?:https?:)?//[^"]*"[^>]*>', alt, text)


def _relpath(target: Path, start: Path) -> str:
    import os

    return os.path.relpath(target, start)


# ----- pages -----
def _shell(title: str, body: str, depth: int, live: bool) -> str:
    up = "../" * depth
    scripts = (f'<script src="{up}assets/plotly.min.js"></script>\n<script src="{up}assets/ampviz-site.js"></script>\n'
               if live else "")
    mount = "<script>window.AmpvizSite.mountAll();</script>\n" if live else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<link rel="stylesheet" href="{up}assets/site.css">\n<link rel="stylesheet" href="{up}assets/pygments.css">\n'
            f"{scripts}</head>\n<body>\n<nav><a href=\"{up}index.html\">ampviz</a>"
            f"<a href=\"{up}notebooks/00_start_here.html\">Start here</a>"
            f"<a href=\"{up}TEACHING.html\">Teachers' guide</a><a href=\"{up}GLOSSARY.html\">Glossary</a></nav>\n"
            f"<main>\n{body}\n</main>\n{mount}</body></html>\n")


def _markdown(text: str) -> str:
    import mistune

    seen: dict = {}

    class Renderer(mistune.HTMLRenderer):
        def heading(self, text, level, **attrs):
            slug = _slug(text)
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchor = slug if n == 0 else f"{slug}-{n}"
            return f'<h{level} id="{anchor}">{text}</h{level}>\n'

    md = mistune.create_markdown(renderer=Renderer(escape=False), plugins=["strikethrough", "table", "footnotes"])
    return f'<div class="md">{md(text)}</div>'


def _title_of(text: str, fallback: str) -> str:
    m = re.search(r"^#\s+(.+)$", text, flags=re.M)
    return m.group(1).strip() if m else fallback


def _explorer_call(source: str):
    """(name, args, kwargs) of a cell whose last statement calls a widget class by name; None else."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if not tree.body or not isinstance(tree.body[-1], ast.Expr) or not isinstance(tree.body[-1].value, ast.Call):
        return None
    call = tree.body[-1].value
    if not isinstance(call.func, ast.Name):
        return None
    try:
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except ValueError:
        args, kwargs = None, None  # the call reads the lesson's variables: only a kernel has them
    return call.func.id, args, kwargs


def _state_json(widget) -> str:
    state = {k: v for k, v in widget.get_state().items() if not k.startswith("_")}
    # inside a script element: "</" would end it
    return json.dumps(state, separators=(",", ":")).replace("</", "<\\/")


def _live(widget, name: str, counter: list) -> str:
    """A page-computed explorer: where it mounts, and its state."""
    counter[0] += 1
    sid = f"ampviz-state-{counter[0]}"
    return (f'<div class="ampviz-live-note">Live in this page: {html.escape(name)}, computed by your browser '
            f'(no kernel).</div>\n<div data-ampviz-explorer="{type(widget).__name__}" data-ampviz-state="{sid}"></div>\n'
            f'<script type="application/json" id="{sid}">{_state_json(widget)}</script>')


def _kernel_note(name: str, binder: str) -> str:
    return (f'<div class="ampviz-kernel-note">{html.escape(name)} runs in a Python kernel: '
            f'<a href="{binder}">open this notebook on Binder</a> (or <code>make lab</code>) to use it.</div>')


def _notebook_page(path: Path, counter: list) -> tuple[str, str, bool]:
    """(title, body HTML, whether it has a live explorer) of one notebook."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    page_versions, kernel_widgets = _page_explorers(), _kernel_widgets()
    binder = BINDER.format(name=path.name)
    live = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        found = _explorer_call(cell.source)
        if not found or found[0] not in kernel_widgets:
            continue
        name, args, kwargs = found
        if name == "ExplorerApp":
            from ampviz.widgets import ExplorerApp

            parts = []
            for title in ExplorerApp.TITLES:
                make = _app_tabs().get(title)
                parts.append(f"<h3>{html.escape(title)}</h3>\n"
                             + (_live(make(), title, counter) if make else _kernel_note(f"The {title} tab", binder)))
            html_out = "\n".join(parts)
            live = live or bool(_app_tabs())
        elif name in page_versions and args is not None:
            html_out = _live(page_versions[name](*args, **kwargs), name, counter)
            live = True
        else:
            html_out = _kernel_note(name, binder)
        cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": html_out})]
    body, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
    banner = (f'<p class="ampviz-site-banner">This is the lesson as the course stores it: its text, its code and '
              f'the outputs it checks. To run the code, <a href="{binder}">open it on Binder</a> or with '
              f"<code>make lab</code>.</p>")
    title = _title_of(next((c.source for c in nb.cells if c.cell_type == "markdown"), ""), path.stem)
    return title, banner + body, live


def build(out: Path = DEFAULT_OUT) -> list[Path]:
    """Build the site into ``out`` (emptied first); returns the pages written."""
    import plotly
    from pygments.formatters import HtmlFormatter

    from ampviz.widgets.jsbundle import classic

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / "assets").mkdir(parents=True)
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", out / "assets" / "plotly.min.js")
    (out / "assets" / "ampviz-site.js").write_text(classic("site", "AmpvizSite"))
    (out / "assets" / "site.css").write_text(CSS)
    (out / "assets" / "pygments.css").write_text(HtmlFormatter().get_style_defs(".highlight"))

    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    markdown = [ROOT / "README.md", *sorted(p for p in ROOT.glob("*.md") if p.name != "README.md"),
                *sorted((ROOT / "ampviz").glob("**/README.md"))]
    pages = {p.relative_to(ROOT): Path("notebooks") / f"{p.stem}.html" for p in notebooks}
    for p in markdown:
        rel = p.relative_to(ROOT)
        pages[rel] = Path("index.html") if rel == Path("README.md") else rel.with_suffix(".html")
    written, counter = [], [0]
    for p in markdown:
        rel = p.relative_to(ROOT)
        text = p.read_text()
        target = out / pages[rel]
        target.parent.mkdir(parents=True, exist_ok=True)
        body = _rewrite_links(_markdown(text), p, out, pages)
        target.write_text(_shell(_title_of(text, p.stem), body, len(pages[rel].parts) - 1, live=False))
        written.append(target)
    for p in notebooks:
        rel = p.relative_to(ROOT)
        title, body, live = _notebook_page(p, counter)
        target = out / pages[rel]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_shell(title, _rewrite_links(body, p, out, pages), 1, live))
        written.append(target)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Build the course as a static site (opens from file://, offline).")
    parser.add_argument("out", nargs="?", default=str(DEFAULT_OUT), help="the folder to write (emptied first)")
    args = parser.parse_args(argv)
    pages = build(Path(args.out))
    print(f"{len(pages)} pages in {args.out}; open {Path(args.out) / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
