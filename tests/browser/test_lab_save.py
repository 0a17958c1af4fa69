"""A teacher's or learner's save in the course's JupyterLab leaves the clone clean: open a lesson,
Run All, save, and the notebook and its paired script are byte for byte what the repository has.

JupyterLab runs as `make lab` starts it (the repository first on JUPYTER_CONFIG_PATH, so that the
pre-save hook of jupyter_server_config.py strips the notebook and Jupytext writes the script), on
a copy of the notebooks, scripts and settings."""

import sys
import time
from pathlib import Path

from conftest import OUTPUT, outputs_without_tracebacks

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the course's JupyterLab helpers
from course_lab import TOKEN, jupyter_lab, make_lab_env, repo_copy  # noqa: E402

NOTEBOOK = "01_fp16_range"  # ten checked outputs: tables, printed casts, the claims cell
ALL_RUN = """() => { const p = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
    .map(e => e.textContent.trim()); return p.length > 0 && p.every(t => /^\\[\\d+\\]:$/.test(t)); }"""


def test_run_all_and_save_changes_nothing(browser, tmp_path):
    repo = repo_copy(tmp_path / "repo")
    files = [repo / "notebooks" / f"{NOTEBOOK}.ipynb", repo / "notebook_scripts" / f"{NOTEBOOK}.py"]
    before = [f.read_bytes() for f in files]
    listed = sorted(p.name for p in (repo / "notebooks").iterdir())
    with jupyter_lab(repo, make_lab_env(repo), tmp_path / "scratch") as url:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(f"{url}/lab/tree/notebooks/{NOTEBOOK}.ipynb?reset&token={TOKEN}")
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=90_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        page.wait_for_function(ALL_RUN, timeout=300_000, polling=500)
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
        assert outputs_without_tracebacks(page) == []
        # unchecked cells show their outputs in the page (the figure, the explorers) ...
        assert page.locator(".jp-Notebook .js-plotly-plot").count() > 0
        saved_at = files[0].stat().st_mtime_ns
        page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})  # focus the notebook
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + 60
        while files[0].stat().st_mtime_ns == saved_at and time.monotonic() < deadline:
            time.sleep(0.25)
        assert files[0].stat().st_mtime_ns != saved_at, "the notebook was not saved"
        page.wait_for_timeout(1_000)  # the script is written in the same request
        page.screenshot(path=str(OUTPUT / "lab_saved_after_run_all.png"))
        page.close()
    # ... and the files keep exactly what the repository keeps
    assert [f.read_bytes() for f in files] == before
    assert sorted(p.name for p in (repo / "notebooks").iterdir() if p.name != ".ipynb_checkpoints") == listed
