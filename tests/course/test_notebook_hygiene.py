"""Committed notebooks stay small, clean, checkable and paired, and ``import ampviz`` stays light.

Rules (see the architecture notes): outputs only on cells marked ``# NBVAL_CHECK_OUTPUT`` (and
those need an output and an execution count, or nbval cannot compare them); no error outputs, no
stderr, no plotly or widget outputs in checked cells; no widget state; under 1 MB.

Every notebook is paired by Jupytext (``jupytext.toml``) with a percent-format script in
``notebook_scripts/``: the script exists, and its cells, read by Jupytext, are the notebook's.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
from jupytext.config import load_jupytext_config
from jupytext.paired_paths import paired_paths

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
MAX_BYTES = 1_000_000
MARKERS = {"# NBVAL_CHECK_OUTPUT", "# NBVAL_IGNORE_OUTPUT", "# NBVAL_SKIP", "# NBVAL_RAISES_EXCEPTION"}
FORBIDDEN_IN_CHECKED = ("application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json",
                        "application/vnd.jupyter.widget-state+json")


SCRIPT_DIR = ROOT / "notebook_scripts"


sys.path.insert(0, str(ROOT / "tools"))  # the repository's tools, imported as the scripts import each other
import strip_notebook as strip_tool  # noqa: E402


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def problems(nb: dict, size: int = 0) -> list[str]:
    """Everything wrong with one notebook (as a JSON dict), as readable lines."""
    out = []
    if size > MAX_BYTES:
        out.append(f"{size:,} bytes (limit {MAX_BYTES:,})")
    if "widgets" in nb.get("metadata", {}):
        out.append("stores widget state (metadata.widgets)")
    for i, cell in enumerate(nb.get("cells", [])):
        src = _source(cell)
        for line in src.splitlines():
            if line.strip().lstrip("#").strip().startswith("NBVAL") and line.strip() not in MARKERS:
                out.append(f"cell {i}: marker line {line.strip()!r} is not exactly a marker (nbval ignores it)")
        if cell.get("cell_type") != "code":
            continue
        checked = strip_tool.is_checked(cell)
        outputs = cell.get("outputs", [])
        if not checked:
            if outputs:
                out.append(f"cell {i}: unchecked cell keeps {len(outputs)} output(s)")
            if cell.get("execution_count") is not None:
                out.append(f"cell {i}: unchecked cell keeps an execution count")
            continue
        if not outputs:
            out.append(f"cell {i}: checked cell has no stored output")
        if cell.get("execution_count") is None:
            out.append(f"cell {i}: checked cell has no execution count (nbval: unrun reference cell)")
        for o in outputs:
            kind = o.get("output_type")
            if kind == "error":
                out.append(f"cell {i}: stores an error output ({o.get('ename')})")
            if kind == "stream" and o.get("name") == "stderr":
                out.append(f"cell {i}: checked cell writes to stderr")
            for mime in o.get("data", {}):
                if mime in FORBIDDEN_IN_CHECKED:
                    out.append(f"cell {i}: checked cell stores {mime}")
            html = "".join(o.get("data", {}).get("text/html", ""))
            if "plotly" in html.lower():
                out.append(f"cell {i}: checked cell stores a plotly figure as HTML")
    return out


# ----- the committed notebooks -----
def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    for expected in ("00_start_here.ipynb", "01_fp16_range.ipynb", "02_loss_scaling.ipynb",
                     "04_gradscaler_internals.ipynb", "06_scaling_lab.ipynb", "07_live_training.ipynb",
                     "08_lightning_manual_backward.ipynb", "09_lightning_autocast_cache.ipynb",
                     "10_lightning_transformer_eval.ipynb", "explorer.ipynb"):
        assert expected in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_clean(path):
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)  # valid JSON
    nbformat.validate(nbformat.reads(text, as_version=4))
    assert problems(nb, size=path.stat().st_size) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stripped(path):
    """Running the strip tool on a committed notebook changes nothing."""
    assert not strip_tool.strip_file(path, check_only=True)


LESSONS = [p for p in NOTEBOOKS if p.name[:2].isdigit() and p.name[:2] != "00"]  # not the map, not the app


@pytest.mark.parametrize("path", LESSONS, ids=[p.name for p in LESSONS])
def test_lesson_anatomy(path):
    """H1 title first, a setup cell, "Try it" and "Check yourself" sections, checked outputs."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown" and _source(cells[0]).startswith("# ")
    headings = [line for c in cells if c["cell_type"] == "markdown" for line in _source(c).splitlines()
                if line.startswith("#")]
    assert any("Try it" in h for h in headings) and any("Check yourself" in h for h in headings)
    code = [c for c in cells if c["cell_type"] == "code"]
    assert "import" in _source(code[0])
    imports_later = [i for i, c in enumerate(code[1:], 1) if any(
        line.startswith(("import ", "from ")) for line in _source(c).splitlines())]
    assert imports_later == [], "imports belong in the one setup cell"
    assert any(strip_tool.is_checked(c) for c in code)
    assert any("assert " in _source(c) for c in code)


def test_explorer_app_is_a_title_and_one_call():
    """The explorer app (served by Voila, code hidden) has no lesson logic: an H1, one code cell
    that builds ``ExplorerApp`` as its last expression."""
    nb = json.loads((NOTEBOOK_DIR / "explorer.ipynb").read_text(encoding="utf-8"))
    kinds = [c["cell_type"] for c in nb["cells"]]
    assert kinds == ["markdown", "code"]
    assert _source(nb["cells"][0]).startswith("# ")
    lines = [line for line in _source(nb["cells"][1]).splitlines() if line and not line.startswith("#")]
    assert lines == ["from ampviz.widgets import ExplorerApp", "ExplorerApp()"]


# ----- the rules above can fail -----
def _nb(cells, **meta):
    return {"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}


def _code(src, outputs=(), count=None):
    return {"cell_type": "code", "source": src, "outputs": list(outputs), "execution_count": count,
            "metadata": {}}


def _stream(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


def test_problems_are_found():
    plotly_out = {"output_type": "display_data", "data": {"application/vnd.plotly.v1+json": {}}, "metadata": {}}
    error = {"output_type": "error", "ename": "ValueError", "evalue": "x", "traceback": []}
    bad = _nb([
        _code("x = 1", [_stream("1")], 1),                                     # unchecked with output
        _code("# NBVAL_CHECK_OUTPUT\nx", [], None),                             # checked, never run
        _code("# NBVAL_CHECK_OUTPUT\nfig", [plotly_out], 3),                    # plotly in checked
        _code("# NBVAL_CHECK_OUTPUT\n1/0", [error, _stream("w", "stderr")], 4),  # error + stderr
        _code("# NBVAL_CHECK_OUTPUT (the table)\nt", [], None),                 # near-miss marker
        _code("#NBVAL_CHECK_OUTPUT\nt", [], None),                              # nbval reads it, strip does not
    ], widgets={"state": {}})
    found = "\n".join(problems(bad, size=2_000_000))
    for expected in ("bytes", "widget state", "cell 0: unchecked cell keeps 1 output",
                     "cell 0: unchecked cell keeps an execution count", "cell 1: checked cell has no stored output",
                     "cell 1: checked cell has no execution count", "cell 2: checked cell stores application/vnd.plotly",
                     "cell 3: stores an error output", "cell 3: checked cell writes to stderr",
                     "cell 4: marker line", "cell 5: marker line"):
        assert expected in found
    good = _nb([_code("# NBVAL_CHECK_OUTPUT\nprint(1)", [_stream("1\n")], 2), _code("y = 2")])
    assert problems(good, size=100) == []


def test_strip_keeps_only_checked_outputs():
    nb = _nb([
        _code("# NBVAL_CHECK_OUTPUT\nprint(1)", [_stream("1\n")], 5),
        _code("print(2)", [_stream("2\n")], 6),
        _code("  # NBVAL_CHECK_OUTPUT  \nprint(3)", [_stream("3\n")], 7),
        {"cell_type": "markdown", "source": "# NBVAL_CHECK_OUTPUT", "metadata": {"execution": {"t": 1}}},
    ], widgets={"application/vnd.jupyter.widget-state+json": {}})
    nb["cells"][1]["metadata"]["execution"] = {"iopub.status.busy": "2024"}
    out = strip_tool.strip(nb)
    assert "widgets" not in out["metadata"]
    assert out["cells"][0]["outputs"] == [_stream("1\n")]
    assert out["cells"][1]["outputs"] == [] and out["cells"][1]["execution_count"] is None
    assert out["cells"][1]["metadata"] == {} and out["cells"][3]["metadata"] == {}
    assert out["cells"][2]["outputs"] == [_stream("3\n")]  # nbval strips the line too
    assert problems(out) == []
    assert nb["cells"][1]["outputs"]  # the input is left alone
    assert nb["cells"][0]["execution_count"] == 5


def test_strip_keeps_what_a_run_all_gives_whatever_the_run():
    """A checked cell's count is its position among the code cells (Run All in a fresh kernel),
    its stream outputs are joined as JupyterLab shows them, the Python version is dropped: two runs
    that printed the same text store the same notebook."""
    result = {"output_type": "execute_result", "data": {"text/plain": "3"}, "metadata": {}, "execution_count": 41}
    run_twice = _nb([
        {"cell_type": "markdown", "source": "# Title", "metadata": {}},
        _code("x = 1", [], 40),
        _code("# NBVAL_CHECK_OUTPUT\nprint('a'); print('b')", [_stream("a\n"), _stream(["b", "\n"])], 39),
        _code("# NBVAL_CHECK_OUTPUT\nx + 2", [result], 41),
    ], language_info={"name": "python", "version": "3.11.9"})
    run_once = _nb([
        {"cell_type": "markdown", "source": "# Title", "metadata": {}},
        _code("x = 1", [], 1),
        _code("# NBVAL_CHECK_OUTPUT\nprint('a'); print('b')", [_stream("a\nb\n")], 2),
        _code("# NBVAL_CHECK_OUTPUT\nx + 2", [{**result, "execution_count": 3}], 3),
    ], language_info={"name": "python", "version": "3.11.7"})
    for nb in (run_twice, run_once):
        for i, cell in enumerate(nb["cells"]):
            cell["id"] = f"cell-{i}"
    a, b = strip_tool.strip(run_twice), strip_tool.strip(run_once)
    assert a == b
    assert [c.get("execution_count") for c in a["cells"]] == [None, None, 2, 3]
    assert a["cells"][2]["outputs"] == [_stream("a\nb\n")] and a["cells"][3]["outputs"][0]["execution_count"] == 3
    assert a["metadata"]["language_info"] == {"name": "python"}
    assert strip_tool.dumps(a) == strip_tool.dumps(b)
    # streams of different names, or not next to each other, stay apart
    mixed = _nb([_code("# NBVAL_CHECK_OUTPUT\nf()", [_stream("a"), _stream("w", "stderr"), _stream("b")], 1)])
    assert [o["name"] for o in strip_tool.strip(mixed)["cells"][0]["outputs"]] == ["stdout", "stderr", "stdout"]
    with pytest.raises(TypeError, match="strip needs a notebook"):
        strip_tool.strip(["not", "a", "notebook"])


def test_strip_file_writes_as_the_jupyter_server_writes(tmp_path):
    """A stripped file is byte for byte what nbformat.write (the server's writer) gives."""
    path = tmp_path / "nb.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)\nprint(2)")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n2\n")]
    nb.cells[0].execution_count = 1
    nbformat.write(nb, path)
    assert not strip_tool.strip_file(path, check_only=True)
    path.write_text(json.dumps(json.loads(path.read_text()), indent=2))  # same notebook, other layout
    assert strip_tool.strip_file(path)
    written = path.read_text(encoding="utf-8")
    nbformat.write(nbformat.read(path, as_version=4), path)
    assert path.read_text(encoding="utf-8") == written


# ----- import ampviz stays light -----
def test_import_ampviz_loads_no_heavy_packages():
    code = ("import sys, ampviz, ampviz.formats.census, ampviz.formats, ampviz.text, ampviz.checks, ampviz.formats.lesson, ampviz.formats.errors, ampviz.scaling.lesson, ampviz.env; "
            "heavy = {'plotly', 'ipywidgets', 'torch'} & set(sys.modules); "
            "assert not heavy, heavy")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ----- each notebook and its paired script agree -----
def paired_script(notebook: Path) -> Path | None:
    """The script Jupytext pairs with ``notebook`` under the repository's jupytext.toml (None if
    no pairing applies to it), as Jupytext itself computes it."""
    config = load_jupytext_config(str(notebook))
    formats = config.default_formats(str(notebook)) if config is not None else None
    if not formats:
        return None
    others = [Path(p) for p, fmt in paired_paths(str(notebook), "ipynb", formats)
              if fmt.get("extension") == ".py" and fmt.get("format_name") == "percent"]
    return others[0] if len(others) == 1 else None


def cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def pair_problems(notebook: Path, script: Path) -> list[str]:
    """How ``script`` (read by Jupytext as py:percent) differs from ``notebook``, as readable lines."""
    if not script.is_file():
        return [f"{notebook.name} has no paired script {script.relative_to(script.parents[1])}"]
    ours, theirs = cells(nbformat.read(notebook, as_version=4)), cells(jupytext.read(script, fmt="py:percent"))
    out = []
    if len(ours) != len(theirs):
        out.append(f"{notebook.name} has {len(ours)} cells, {script.name} {len(theirs)}")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            first = next((x for x, y in zip(a[1].splitlines() or [""], b[1].splitlines() or [""]) if x != y), "")
            out.append(f"cell {i} differs between {notebook.name} and {script.name} ({a[0]} / {b[0]}; {first[:60]!r})")
    return out


def test_jupytext_pairs_the_notebooks_with_percent_scripts():
    """jupytext.toml (at the repository root, found by Jupytext from the notebooks) pairs each
    notebook with a py:percent script of the same name in notebook_scripts/, outside notebooks/."""
    for path in NOTEBOOKS:
        assert paired_script(path) == SCRIPT_DIR / f"{path.stem}.py", path.name
    assert paired_script(ROOT / "tests" / "some.ipynb") is None  # only notebooks/ is paired


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_and_its_script_have_the_same_cells(path):
    """An edit to one side that did not reach the other (JupyterLab with Jupytext writes both;
    outside it, `jupytext --sync` or tools/run_notebooks.py) leaves the pair disagreeing."""
    assert pair_problems(path, paired_script(path)) == [], (
        f"run `.venv/bin/jupytext --sync notebooks/{path.name}` (the side edited last wins)")


def test_every_script_has_its_notebook():
    scripts = sorted(SCRIPT_DIR.glob("*.py"))
    assert scripts, "notebook_scripts/ holds no scripts"
    assert [s.name for s in scripts if not (NOTEBOOK_DIR / f"{s.stem}.ipynb").exists()] == []
    assert sorted(s.stem for s in scripts) == sorted(p.stem for p in NOTEBOOKS)


def test_an_unsynced_edit_is_found(tmp_path):
    """The pairing check fails for an edit made to either side alone, and for a missing script."""
    notebook, script = tmp_path / "01_fp16_range.ipynb", tmp_path / "01_fp16_range.py"
    shutil.copy(NOTEBOOK_DIR / notebook.name, notebook)
    shutil.copy(SCRIPT_DIR / script.name, script)
    assert pair_problems(notebook, script) == []
    original = script.read_text(encoding="utf-8")
    script.write_text(original.replace("# What [fp16]", "# What fp16 [fp16]"),
                      encoding="utf-8")
    assert pair_problems(notebook, script) == [
        "cell 0 differs between 01_fp16_range.ipynb and 01_fp16_range.py "
        "(markdown / markdown; 'What [fp16](../GLOSSARY.md#fp16), [bf16](../GLOSSARY.md#bf16')"]
    script.write_text(original, encoding="utf-8")
    nb = nbformat.read(notebook, as_version=4)
    nb.cells[1].source += "\nprint('only in the notebook')"
    nbformat.write(nb, notebook)
    assert [p.split(" (")[0] for p in pair_problems(notebook, script)] == [
        "cell 1 differs between 01_fp16_range.ipynb and 01_fp16_range.py"]
    nb.cells.append(nbformat.v4.new_markdown_cell("A new cell"))
    nbformat.write(nb, notebook)
    cells = len(nb.cells)
    assert f"01_fp16_range.ipynb has {cells} cells, 01_fp16_range.py {cells - 1}" in pair_problems(notebook, script)
    script.unlink()
    assert pair_problems(notebook, script)[0].startswith("01_fp16_range.ipynb has no paired script")


def test_nbval_and_pytest_collect_no_script():
    """`pytest --nbval-lax notebooks` (make test) and pytest's own collection see no script:
    only the notebooks' cells are collected, and notebook_scripts/ yields no test."""
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "--nbval-lax", "notebooks", "notebook_scripts"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    items = [line for line in result.stdout.splitlines() if "::" in line]
    assert items and all(line.startswith("notebooks/") and ".ipynb::" in line for line in items), items[:5]
    assert {line.split("::")[0] for line in items} == {f"notebooks/{p.name}" for p in NOTEBOOKS}


def test_the_course_turns_off_jupyterlabs_news_toast():
    """tools/jupyterlab_overrides.json holds valid settings of JupyterLab's notification plugin,
    and both installs (make, Binder) put it where JupyterLab reads overrides."""
    import json

    settings = json.loads((ROOT / "tools" / "jupyterlab_overrides.json").read_text())
    notification = settings["@jupyterlab/apputils-extension:notification"]
    assert notification == {"fetchNews": "false", "checkForUpdates": False}
    schema = next((ROOT / ".venv" / "share" / "jupyter" / "lab" / "schemas").glob(
        "@jupyterlab/apputils-extension/notification.json"), None)
    if schema is not None:  # the installed JupyterLab's own schema
        props = json.loads(schema.read_text())["properties"]
        assert {"const": "false", "title": "Never"} in props["fetchNews"]["oneOf"]
        assert props["checkForUpdates"]["type"] == "boolean"
    assert "share/jupyter/lab/settings/overrides.json" in (ROOT / "Makefile").read_text()
    assert "overrides.json" in (ROOT / "binder" / "postBuild").read_text()


def test_no_code_cell_ends_in_a_value_nobody_asked_for():
    """A cell whose last line is `torch.manual_seed(0)` prints `<torch._C.Generator at 0x...>`."""
    import ast

    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            body = ast.parse(cell.source).body
            last = body[-1] if body else None
            if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
                assert "manual_seed" not in ast.unparse(last.value.func), (path.name, cell.source.splitlines()[-1])
