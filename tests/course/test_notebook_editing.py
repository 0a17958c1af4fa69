"""Teachers edit the notebooks in JupyterLab, on either side of their Jupytext pair, and what is
saved stays as the repository keeps it.

JupyterLab saves through its contents manager: with Jupytext installed, Jupytext's, which writes
the notebook and its paired script (jupytext.toml), after the course's pre-save hook
(jupyter_server_config.py) has stripped the notebook. These tests save the way JupyterLab does,
into a copy of the repository's notebooks, scripts and settings, and check both files and the
hygiene rules (tests/course/test_notebook_hygiene.py) afterwards. The last ones start JupyterLab itself
as `make lab` starts it and save over its REST API.
"""

import asyncio
import concurrent.futures
import copy
import json
import os

import nbformat
import pytest
from course_lab import api, jupyter_lab, make_lab_env, repo_copy
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class
from test_notebook_hygiene import pair_problems, problems, strip_tool
from traitlets.config.loader import PyFileConfigLoader

NOTEBOOK = "notebooks/01_fp16_range.ipynb"
SCRIPT = "notebook_scripts/01_fp16_range.py"
OLD, NEW = "A float is stored as a [sign bit]", "A floating-point number is stored as a [sign bit]"


@pytest.fixture
def repo(tmp_path):
    return repo_copy(tmp_path / "repo")


def contents_manager(root):
    """JupyterLab's contents manager for ``root``: Jupytext's, derived from jupyter_server's default
    as Jupytext's server extension derives it, with the settings of ``root``/jupyter_server_config.py."""
    config = PyFileConfigLoader("jupyter_server_config.py", path=str(root)).load_config()
    return build_async_jupytext_contents_manager_class(AsyncLargeFileManager)(root_dir=str(root), config=config)


def _run(make):
    """``asyncio.run(make())`` in a thread of its own: this thread may hold a running event loop
    already (Playwright's sync API keeps one for the browser tests of the same session)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def lab_get(root, path):
    return _run(lambda: contents_manager(root).get(path))


def lab_save(root, path, nb):
    _run(lambda: contents_manager(root).save({"type": "notebook", "content": nb}, path))


def as_after_a_run(nb):
    """``nb`` as JupyterLab holds it after the cells ran twice and a widget was shown: every code
    cell with outputs and a late execution count, checked cells' streams split into two messages,
    widget state, the kernel's Python version."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = 100 + i
        if not strip_tool.is_checked(cell):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="noise\n"),
                            nbformat.v4.new_output("error", ename="E", evalue="x", traceback=[])]
            continue
        outputs = []
        for out in cell.outputs:
            if out.output_type == "stream" and len(out.text) > 1:
                half = len(out.text) // 2
                outputs += [nbformat.v4.new_output("stream", name=out.name, text=out.text[:half]),
                            nbformat.v4.new_output("stream", name=out.name, text=out.text[half:])]
            else:
                outputs.append(out)
        cell.outputs = outputs
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.metadata.setdefault("language_info", {})["version"] = "3.11.99"
    return nb


def expected_notebook(root, replace):
    """The committed notebook's file text with ``replace(cells)`` applied to its cells."""
    nb = nbformat.read(root / NOTEBOOK, as_version=4)
    replace(nb.cells)
    return strip_tool.dumps(nb)


def check_clean(root):
    """Both files of the pair pass the hygiene checks."""
    path = root / NOTEBOOK
    text = path.read_text(encoding="utf-8")
    assert problems(json.loads(text), size=len(text.encode())) == []
    assert pair_problems(path, root / SCRIPT) == []
    assert not strip_tool.strip_file(path, check_only=True)


def _edit_markdown(cells):
    cell = next(c for c in cells if OLD in c.source)
    cell.source = cell.source.replace(OLD, NEW)


# ----- the notebook side -----
def test_a_notebook_saved_from_jupyterlab_writes_both_files_and_stays_clean(repo):
    script_before = (repo / SCRIPT).read_text(encoding="utf-8")
    expected = expected_notebook(repo, _edit_markdown)
    nb = lab_get(repo, NOTEBOOK)["content"]
    _edit_markdown(nb.cells)
    lab_save(repo, NOTEBOOK, as_after_a_run(nb))
    # the notebook: the edit, the checked outputs as stored, nothing else
    assert (repo / NOTEBOOK).read_text(encoding="utf-8") == expected
    # the script: the edit, nothing else
    assert (repo / SCRIPT).read_text(encoding="utf-8") == script_before.replace(f"# {OLD}", f"# {NEW}")
    assert NEW not in script_before and f"# {NEW}" in (repo / SCRIPT).read_text(encoding="utf-8")
    check_clean(repo)


def test_saving_an_unchanged_notebook_after_a_run_changes_no_byte(repo):
    before = {p: (repo / p).read_bytes() for p in (NOTEBOOK, SCRIPT)}
    lab_save(repo, NOTEBOOK, as_after_a_run(lab_get(repo, NOTEBOOK)["content"]))
    assert {p: (repo / p).read_bytes() for p in (NOTEBOOK, SCRIPT)} == before


def test_without_the_hook_a_save_would_dirty_the_notebook(repo):
    """The wrong variant: the same save with the server's settings left out keeps every output,
    and the hygiene checks catch it."""
    (repo / "jupyter_server_config.py").write_text("c = get_config()  # noqa: F821\n")
    lab_save(repo, NOTEBOOK, as_after_a_run(lab_get(repo, NOTEBOOK)["content"]))
    found = "\n".join(problems(json.loads((repo / NOTEBOOK).read_text(encoding="utf-8"))))
    assert "stores widget state" in found and "unchecked cell keeps 2 output(s)" in found
    assert pair_problems(repo / NOTEBOOK, repo / SCRIPT) == []  # Jupytext still wrote the script


def test_notebooks_elsewhere_keep_their_outputs(repo):
    """The hook strips only the course's notebooks: a learner's own notebook outside notebooks/
    keeps what it showed, and gets no paired script."""
    nb = as_after_a_run(lab_get(repo, NOTEBOOK)["content"])
    lab_save(repo, "my_notes.ipynb", nb)
    saved = nbformat.read(repo / "my_notes.ipynb", as_version=4)
    assert [c.outputs for c in saved.cells if c.cell_type == "code"] == [
        c.outputs for c in nb.cells if c.cell_type == "code"]
    assert "widgets" in saved.metadata
    assert not list(repo.glob("**/my_notes.py"))


# ----- the script side -----
def _edit_code(cells):
    cell = next(c for c in cells if c.cell_type == "code" and c.source.startswith("# NBVAL_CHECK_OUTPUT\nformat_table()"))
    cell.source = cell.source.replace("format_table()", "format_table()  # fp16, bf16 and fp8 side by side")


def _edit_script(repo):
    script = repo / SCRIPT
    text = script.read_text(encoding="utf-8")
    assert text.count("\nformat_table()\n") == 1
    script.write_text(text.replace("\nformat_table()\n", "\nformat_table()  # fp16, bf16 and fp8 side by side\n"),
                      encoding="utf-8")
    later = (repo / NOTEBOOK).stat().st_mtime + 10  # edited after the notebook was last saved
    os.utime(script, (later, later))


def test_an_edit_to_the_script_reaches_the_notebook_opened_in_jupyterlab(repo):
    """JupyterLab opens the notebook with the script's cells and the notebook's outputs; saving it
    writes the edit into the .ipynb, checked outputs kept."""
    expected = expected_notebook(repo, _edit_code)
    _edit_script(repo)
    assert pair_problems(repo / NOTEBOOK, repo / SCRIPT) != []  # unsynced until it is saved
    nb = lab_get(repo, NOTEBOOK)["content"]
    cell = next(c for c in nb.cells if c.cell_type == "code" and "format_table()  # fp16" in c.source)
    assert cell.outputs and "65504" in json.dumps(cell.outputs)  # the stored table, from the .ipynb
    lab_save(repo, NOTEBOOK, nb)
    assert (repo / NOTEBOOK).read_text(encoding="utf-8") == expected
    check_clean(repo)


def test_an_edit_to_the_script_reaches_the_notebook_through_jupytext_sync(repo):
    """Outside JupyterLab (an editor, then `jupytext --sync`, as tools/run_notebooks.py does first)."""
    import run_notebooks

    expected = expected_notebook(repo, _edit_code)
    _edit_script(repo)
    run_notebooks.sync(repo / NOTEBOOK)
    assert (repo / NOTEBOOK).read_text(encoding="utf-8") == expected
    check_clean(repo)


# ----- JupyterLab itself, started as `make lab` starts it -----
def test_make_lab_puts_the_repository_on_jupyters_config_path(repo):
    assert make_lab_env(repo) == {"JUPYTER_CONFIG_PATH": str(repo)}


@pytest.mark.parametrize("how", ["make lab", "without the config path"])
def test_jupyterlab_strips_on_save_only_with_the_courses_settings(repo, tmp_path, how):
    """`make lab` puts the repository first on JUPYTER_CONFIG_PATH, and only so does the server read
    jupyter_server_config.py (it does not look in the folder it starts in): saved over the REST
    API as the browser saves, the notebook is stripped and its script rewritten. Without it the
    outputs stay, which is why a JupyterLab started by hand needs the same variable."""
    env = make_lab_env(repo) if how == "make lab" else {}
    script_before = (repo / SCRIPT).read_text(encoding="utf-8")
    with jupyter_lab(repo, env, tmp_path / "scratch") as url:
        model = api(url, NOTEBOOK)
        nb = nbformat.from_dict(model["content"])
        _edit_markdown(nb.cells)
        api(url, NOTEBOOK, {"type": "notebook", "format": "json", "content": as_after_a_run(nb)})
    assert (repo / SCRIPT).read_text(encoding="utf-8") == script_before.replace(f"# {OLD}", f"# {NEW}")
    found = problems(json.loads((repo / NOTEBOOK).read_text(encoding="utf-8")))
    if how == "make lab":
        assert found == []
        check_clean(repo)
    else:
        assert any("unchecked cell keeps" in p for p in found)
    log = (tmp_path / "scratch" / "lab.log").read_text()
    assert "Pre-save hook" not in log and "Overriding existing pre_save_hook" not in log, log[-3000:]


# ----- the refresh tool -----
TINY = '''# %% [markdown]
# # A tiny lesson

# %%
# NBVAL_CHECK_OUTPUT
print(6 * 7)

# %%
print("not kept")
'''


def _tiny_pair(repo, script_text):
    (repo / "notebook_scripts" / "99_tiny.py").write_text(script_text, encoding="utf-8")
    import run_notebooks

    run_notebooks.sync(repo / "notebook_scripts" / "99_tiny.py")  # a new script: Jupytext creates the notebook
    return repo / "notebooks" / "99_tiny.ipynb"


def test_the_refresh_tool_stores_the_checked_output_of_a_fresh_run(repo):
    import run_notebooks

    notebook = _tiny_pair(repo, TINY)
    later = notebook.stat().st_mtime + 10
    script = repo / "notebook_scripts" / "99_tiny.py"
    script.write_text(TINY.replace("6 * 7", "6 * 8"), encoding="utf-8")  # edited on the script side
    os.utime(script, (later, later))
    run_notebooks.refresh(notebook)
    nb = nbformat.read(notebook, as_version=4)
    assert [c.source for c in nb.cells][1] == "# NBVAL_CHECK_OUTPUT\nprint(6 * 8)"
    assert [(c.execution_count, c.outputs) for c in nb.cells[1:]] == [
        (1, [nbformat.v4.new_output("stream", name="stdout", text="48\n")]), (None, [])]
    assert problems(json.loads(notebook.read_text(encoding="utf-8"))) == []
    assert pair_problems(notebook, script) == []
    assert not strip_tool.strip_file(notebook, check_only=True)


@pytest.mark.parametrize("cell, message", [
    ("import warnings; warnings.warn('careful')", "stderr output in cells [1]"),
    ("1 / 0", "a cell raised"),
])
def test_the_refresh_tool_refuses_a_cell_that_fails_or_warns(repo, cell, message):
    import run_notebooks

    notebook = _tiny_pair(repo, TINY.replace("print(6 * 7)", cell))
    before = notebook.read_bytes()
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        run_notebooks.refresh(notebook)
    assert notebook.read_bytes() == before
