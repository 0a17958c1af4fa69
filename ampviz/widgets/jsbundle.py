"""The browser modules of ``ampviz/widgets/js`` joined into one ES module, with no bundler.

A widget's front end (anywidget's ``_esm``) is one module text: it cannot import files beside
it. A static page opened from ``file://`` cannot import modules from files either. ``bundle``
joins an entry module and every module it imports (``import {a, b} from "./x.mjs"``, ``import *
as X from "./x.mjs"``) into one text: each imported module runs inside a function of its own
(its private names stay private) and hands back its exports, and the entry keeps its own
``export`` statements. The modules use only those two import forms and ``export function``,
``export async function``, ``export const``, ``export default`` (an imported module's default is its ``default``)
and ``export { a, b as c };`` (names the module declares or imports, as a module re-exports what it
imports); anything else is an error.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

__all__ = ["JS_DIR", "bundle", "classic"]

JS_DIR = Path(__file__).parent / "js"

_IMPORT = re.compile(r'^import\s+(?:\{([^}]*)\}|\*\s+as\s+(\w+))\s+from\s+"\./([\w-]+)\.mjs";\s*$', re.M)
_EXPORT = re.compile(r"^export\s+(?:async\s+function\*?|function\*?|const|let|class)\s+(\w+)", re.M)
_EXPORT_LIST = re.compile(r"^export\s*\{([^}]*)\}\s*;?[ \t]*$", re.M)


def _source(name: str) -> str:
    path = JS_DIR / f"{name}.mjs"
    if not path.is_file():
        raise ValueError(f"no browser module {name!r} in ampviz/widgets/js; there are: "
                         f"{', '.join(sorted(p.stem for p in JS_DIR.glob('*.mjs')))}")
    return path.read_text()


def _imports(text: str) -> list[str]:
    stray = [line for line in text.splitlines() if line.startswith("import ") and not _IMPORT.match(line)]
    if stray:
        raise ValueError(f"cannot bundle the import {stray[0]!r}: use import {{a, b}} or import * as X from \"./x.mjs\"")
    return [m.group(3) for m in _IMPORT.finditer(text)]


def _order(entry: str) -> list[str]:
    """The modules ``entry`` needs, each after the ones it imports, ``entry`` last."""
    done: list[str] = []

    def visit(name: str, path: tuple) -> None:
        if name in path:
            raise ValueError(f"the browser modules import each other in a circle: {' -> '.join(path + (name,))}")
        if name in done:
            return
        for dep in _imports(_source(name)):
            visit(dep, path + (name,))
        done.append(name)

    visit(entry, ())
    return done


def _linked(text: str) -> str:
    """``text`` with its imports read from the modules already defined above it."""
    def replace(m: re.Match) -> str:
        var = f"__ampviz_{m.group(3).replace('-', '_')}"
        if m.group(2):
            return f"const {m.group(2)} = {var};"
        names = [n.strip() for n in m.group(1).split(",") if n.strip()]
        return "const { " + ", ".join(n.replace(" as ", ": ") for n in names) + f" }} = {var};"
    return _IMPORT.sub(replace, text)


def _unexported(text: str) -> tuple[str, list[str]]:
    """``text`` without its ``export`` keywords and export lists, and what it exported: each name, or
    ``"c: b"`` for ``b as c`` (an object literal's entries), the default as ``default``."""
    names = _EXPORT.findall(text)
    body = _EXPORT.sub(lambda m: m.group(0)[len("export "):], text)
    for m in _EXPORT_LIST.finditer(body):
        for item in (n.strip() for n in m.group(1).split(",")):
            local, _, name = (w.strip() for w in item.partition(" as "))
            if item:
                names.append(f"{name}: {local}" if name and name != local else local)
    body = _EXPORT_LIST.sub("", body)
    body, defaults = re.subn(r"^export default\b", "const __ampviz_default =", body, flags=re.M)
    return body, names + (["default: __ampviz_default"] if defaults else [])


@lru_cache(maxsize=None)
def bundle(entry: str) -> str:
    """One ES module: ``entry`` (a module of ``ampviz/widgets/js``, by name) with every module it
    imports defined before it."""
    parts = []
    for name in _order(entry)[:-1]:
        body, names = _unexported(_linked(_source(name)))
        if re.search(r"^export\b", body, re.M):
            raise ValueError(f"cannot bundle an export of {name}.mjs: use export function, export const or export {{ a, b }}")
        parts.append(f"// ----- {name}.mjs\nconst __ampviz_{name.replace('-', '_')} = (() => {{\n{body}\n"
                     f"return {{ {', '.join(names)} }};\n}})();\n")
    parts.append(f"// ----- {entry}.mjs\n{_linked(_source(entry))}")
    return "\n".join(parts)


@lru_cache(maxsize=None)
def classic(entry: str, name: str) -> str:
    """``bundle(entry)`` as a classic script (for a page opened from ``file://``, where a module
    script cannot be loaded from a file): its exports become ``window[name]``, the default export
    as ``window[name].default``."""
    body, exported = _unexported(bundle(entry))  # (the modules before the entry export nothing any more)
    return f"window.{name} = (() => {{\n{body}\nreturn {{ {', '.join(exported)} }};\n}})();\n"
