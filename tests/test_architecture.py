"""The house as ARCHITECTURE.md draws it, checked from the source: every subpackage and top-level
module of ``ampviz`` is named in its table with a layer, nothing imports from a higher layer or a
library its layer may not use (lazy imports inside functions count), the imports between modules
form no circle, and no module is over 800 lines.

Run as a script, it prints the house's measurements (modules, lines, import arrows, circles,
arrows up): ``python tests/test_architecture.py``.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ampviz"
PAGE = ROOT / "ARCHITECTURE.md"
README = ROOT / "README.md"

MAX_LINES = 800

#: The layers from the bottom up, and the libraries (besides Python's own) each may import;
#: a layer may import what the layers below it may.
LAYERS = ("core", "torch side", "view")
LIBRARIES = {
    "core": {"numpy"},
    "torch side": {"torch", "lightning", "keras", "torchao"},
    "view": {"plotly", "ipywidgets", "anywidget", "traitlets", "ipykernel", "IPython"},
}


# ------------------------------------------------------------------------------------------------
# Reading the source and the page
# ------------------------------------------------------------------------------------------------

def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known) -> tuple[set[str], set[str]]:
    """(the package's modules that ``name`` imports, the outside libraries it imports), counting
    imports anywhere in the file: at the top, inside functions, under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, outside = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            top = target.split(".")[0]
            if top == "ampviz":
                # the deepest module the import names: ampviz.training.live, not ampviz.training
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    inside.add(target)
            elif top not in sys.stdlib_module_names and top != "__future__":
                outside.add(top)
    return inside, outside


def graph(found: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    edges, libraries = {}, {}
    for name, path in found.items():
        edges[name], libraries[name] = imports(name, path, found)
    return edges, libraries


def declared_layers(page: str) -> dict[str, str]:
    """The table rows of ARCHITECTURE.md: each backticked ``ampviz...`` name in the first column,
    with the layer named in the second column."""
    table = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not line.lstrip().startswith("|"):
            continue
        layer = cells[1].strip("* ")
        if layer not in LAYERS:
            continue
        for name in re.findall(r"`(ampviz(?:\.\w+)*)`", cells[0]):
            table[name] = layer
    return table


def layer_of(name: str, table: dict[str, str]) -> str | None:
    """The layer of the longest name in the table that ``name`` is or lies in."""
    while name:
        if name in table:
            return table[name]
        name = name.rpartition(".")[0]
    return None


# ------------------------------------------------------------------------------------------------
# The rules
# ------------------------------------------------------------------------------------------------

def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def arrows_up(edges, table) -> list[tuple[str, str]]:
    """Imports whose target lies in a higher layer than the importer."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return sorted((a, b) for a, targets in edges.items() for b in targets
                  if rank[layer_of(b, table)] > rank[layer_of(a, table)])


def forbidden_libraries(libraries, table) -> list[tuple[str, str]]:
    """(module, library) for each outside library a module imports that its layer may not."""
    bad = []
    for name, used in libraries.items():
        layer = layer_of(name, table)
        allowed = set().union(*(LIBRARIES[x] for x in LAYERS[: LAYERS.index(layer) + 1]))
        bad += [(name, lib) for lib in sorted(used - allowed)]
    return sorted(bad)


def long_modules(found, limit: int = MAX_LINES) -> dict[str, int]:
    lines = {name: len(path.read_text().splitlines()) for name, path in found.items()}
    return {name: n for name, n in sorted(lines.items()) if n > limit}


def rooms(found) -> set[str]:
    """What the page must name: every subpackage and every module directly in ``ampviz``."""
    return {name for name, path in found.items()
            if name.count(".") == 1 and (path.name == "__init__.py" or path.parent == PACKAGE)} | {"ampviz"}


# ------------------------------------------------------------------------------------------------
# The house as it is
# ------------------------------------------------------------------------------------------------

FOUND = modules()
EDGES, LIBRARIES_USED = graph(FOUND)
TABLE = declared_layers(PAGE.read_text())


def test_the_page_names_every_subpackage_and_top_level_module_and_nothing_else():
    named = set(TABLE)
    assert rooms(FOUND) - named == set(), "ARCHITECTURE.md's table must name these, with their layer"
    assert named - set(FOUND) == set(), "ARCHITECTURE.md's table names modules that do not exist"


def test_no_import_circle():
    assert circles(EDGES) == []


def test_nothing_imports_from_a_higher_layer():
    assert arrows_up(EDGES, TABLE) == []


def test_each_layer_imports_only_its_libraries():
    assert forbidden_libraries(LIBRARIES_USED, TABLE) == []


def test_no_module_over_800_lines():
    assert long_modules(FOUND) == {}


def subpackage_pages(package: Path = PACKAGE) -> dict[str, tuple[set[str], set[str]]]:
    """For each subpackage: (its modules' paths inside it, such as ``census.py`` or ``fp8/delayed.py``,
    and the paths its README.md page names in backticks)."""
    pages = {}
    for init in sorted(package.glob("*/__init__.py")):
        folder = init.parent
        page = folder / "README.md"
        named = set(re.findall(r"`([\w/]+\.py)`", page.read_text())) if page.is_file() else set()
        named = {n for n in named if not n.startswith("tests/") and not n.rpartition("/")[2].startswith("test_")}
        pages[folder.name] = ({p.relative_to(folder).as_posix() for p in folder.rglob("*.py")}, named)
    return pages


@pytest.mark.parametrize("name", sorted(subpackage_pages()))
def test_each_subpackage_page_names_its_modules(name):
    """``ampviz/<subpackage>/README.md`` lists every module of the subpackage, and only those."""
    files, named = subpackage_pages()[name]
    assert named, f"ampviz/{name}/README.md is missing or names no module"
    assert files - named == set(), f"ampviz/{name}/README.md must name these modules"
    assert named - files == set(), f"ampviz/{name}/README.md names modules that do not exist"


def test_the_readme_first_screen_has_the_commands_and_the_course_table():
    """A newcomer sees how to open and test the course, and what it teaches, without scrolling far:
    both commands and the course table's first row within the first 60 lines."""
    first = README.read_text().splitlines()[:60]
    text = "\n".join(first)
    assert "make lab" in text and "make test" in text
    assert any(re.match(r"\|\s*\[?`?00", line) for line in first), "the course table starts in the first screen"


def test_every_bench_runs_in_make_bench_and_has_its_target_on_the_bench_page():
    scripts = {p.name for p in (ROOT / "bench").glob("bench_*.py")}
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nbench:"):].split("\n\n")[0]
    page = (ROOT / "bench" / "README.md").read_text()
    assert {s for s in scripts if f"bench/{s}" not in recipe} == set(), "make bench must run these"
    assert {s for s in scripts if f"`bench/{s}`" not in page} == set(), "bench/README.md must describe these"


# ------------------------------------------------------------------------------------------------
# The checks catch what they are for
# ------------------------------------------------------------------------------------------------

def test_a_circle_is_found_however_long():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"x": {"y"}, "y": {"x"}, "z": set()}) == [["x", "y"]]
    assert circles({"x": {"y"}, "y": set()}) == []


def test_an_import_from_a_higher_layer_is_found():
    table = {"ampviz": "core", "ampviz.formats": "core", "ampviz.training": "torch side", "ampviz.plots": "view"}
    edges = {"ampviz.formats.census": {"ampviz.training.live"}, "ampviz.plots": {"ampviz.formats"},
             "ampviz.training.live": {"ampviz.plots"}}
    assert arrows_up(edges, table) == [("ampviz.formats.census", "ampviz.training.live"),
                                       ("ampviz.training.live", "ampviz.plots")]


def test_a_library_above_the_layer_is_found(tmp_path):
    package = tmp_path / "ampviz"
    (package / "formats").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "formats" / "__init__.py").write_text("import numpy\n")
    (package / "formats" / "census.py").write_text(
        "from ampviz.formats import x\n\ndef f():\n    import torch  # lazily\n    from . import lesson\n")
    (package / "formats" / "lesson.py").write_text("import plotly.graph_objects as go\n" + "x = 1\n" * 801)
    found = modules(package)
    edges, libraries = graph(found)
    assert edges["ampviz.formats.census"] == {"ampviz.formats", "ampviz.formats.lesson"}
    table = {"ampviz": "core", "ampviz.formats": "core"}
    assert forbidden_libraries(libraries, table) == [("ampviz.formats.census", "torch"),
                                                     ("ampviz.formats.lesson", "plotly")]
    assert long_modules(found) == {"ampviz.formats.lesson": 802}
    assert rooms(found) == {"ampviz", "ampviz.formats"}


def test_a_page_that_misses_a_module_or_names_a_gone_one_is_found(tmp_path):
    package = tmp_path / "ampviz"
    (package / "scaling").mkdir(parents=True)
    (package / "scaling" / "presets").mkdir()
    for name in ("__init__.py", "simulate.py", "synth.py", "presets/__init__.py", "presets/jmp.py"):
        (package / "scaling" / name).write_text("")
    (package / "scaling" / "README.md").write_text(
        "| `__init__.py` | x |\n| `simulate.py` | y |\n| `presets.py` | z |\n| `presets/__init__.py` | w |\n")
    files, named = subpackage_pages(package)["scaling"]
    assert files - named == {"synth.py", "presets/jmp.py"} and named - files == {"presets.py"}


def test_the_page_table_is_read_with_its_layers():
    page = ("| room | layer | what |\n|---|---|---|\n| `ampviz.formats` | core | bits |\n"
            "| `ampviz.training`, `ampviz.env` | torch side | runs |\n| not a room | view | x |\n")
    assert declared_layers(page) == {"ampviz.formats": "core", "ampviz.training": "torch side",
                                     "ampviz.env": "torch side"}


def measurements() -> str:
    lines = {name: len(path.read_text().splitlines()) for name, path in FOUND.items()}
    over = long_modules(FOUND)
    arrows = sum(len(v) for v in EDGES.values())
    return "\n".join([
        f"modules: {len(FOUND)}, lines: {sum(lines.values()):,}, largest: "
        + ", ".join(f"{n} {lines[n]}" for n in sorted(lines, key=lines.get, reverse=True)[:5]),
        f"over {MAX_LINES} lines: {len(over)} {over or ''}",
        f"import arrows between modules: {arrows}",
        f"circles: {circles(EDGES) or 'none'}",
        f"arrows up a layer: {arrows_up(EDGES, TABLE) or 'none'}",
    ])


if __name__ == "__main__":
    print(measurements())
