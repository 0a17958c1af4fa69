"""The course's Jupyter server settings: saving a lesson keeps the clone clean.

Read by the JupyterLab that `make lab` and Binder start: both put this folder on
JUPYTER_CONFIG_PATH (the Makefile's `lab` target, binder/start), where Jupyter looks for
`jupyter_server_config.py`; a JupyterLab started some other way does not read it.

Every notebook saved under notebooks/ is stripped before it is written, as
tools/strip_notebook.py strips the committed notebooks: outputs only on cells marked
`# NBVAL_CHECK_OUTPUT`, their execution counts numbered as a Run All numbers them, no widget
state. Opening a lesson, running all its cells and saving it therefore changes nothing that git
tracks. Jupytext (a server extension) writes the paired script in notebook_scripts/ at the same
time (see jupytext.toml). Notebooks saved anywhere else are left as they are.
"""

import importlib.util
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = HERE / "notebooks"

_spec = importlib.util.spec_from_file_location("ampviz_strip_notebook", HERE / "tools" / "strip_notebook.py")
_strip_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_strip_tool)


def strip_course_notebooks(model, path, contents_manager, **kwargs):
    """Pre-save hook: strip a notebook model that is about to be written under notebooks/."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    target = (Path(contents_manager.root_dir) / path.strip("/")).resolve()
    if target.is_relative_to(NOTEBOOKS):
        _strip_tool.strip_in_place(model["content"])


c = get_config()  # noqa: F821  (defined by Jupyter when it reads this file)
c.ContentsManager.pre_save_hook = strip_course_notebooks
# jupyter_server's check of a configured hook compares the hook with itself and warns that it
# "overrides" it; there is no other hook to override, so that one message is silenced.
warnings.filterwarnings("ignore", category=UserWarning,
                        message=r"Overriding existing pre_save_hook \(strip_course_notebooks\) with a new one "
                                r"\(strip_course_notebooks\)")

# The course sets no ServerApp.token: the token is JupyterLab's own, generated at start and
# printed in the link (IdentityProvider.token, the setting that replaced ServerApp.token). Still
# the server printed "DeprecationWarning: ServerApp.token config is deprecated ... Use
# IdentityProvider.token" at every start: the notebook_shim extension reads every attribute of
# the server to translate old NotebookApp settings, the deprecated ServerApp.token among them, and
# reading it warns. Python hides a DeprecationWarning raised inside a library, but Voila's
# package turns traitlets' back on for the whole server when it is imported (its server
# extension loads after this file), in front of any filter set here. So Voila is imported here,
# inside catch_warnings, which puts the filters back as they were: its filter is gone, and Python
# hides the libraries' deprecation notices again, as it does without Voila.
with warnings.catch_warnings():
    try:
        import voila  # noqa: F401
    except ImportError:  # a JupyterLab without Voila: nothing turns them on
        pass
