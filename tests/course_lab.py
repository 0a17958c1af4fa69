"""The course's JupyterLab as `make lab` starts it, on a copy of the repository, for tests.

Shared by tests/course/test_notebook_editing.py and tests/browser/test_lab_save.py: a copy of the files
that notebook editing involves (so that nothing a test saves lands in the repository), the
environment `make lab` gives JupyterLab (read from `make -n lab`), and a server started with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ampviz-editing-test"
#: What editing a notebook involves: the pairs, Jupytext's and the server's settings, the strip tool.
EDITING_FILES = ("notebooks", "notebook_scripts", "jupytext.toml", "jupyter_server_config.py",
                 "tools/strip_notebook.py", "Makefile", ".gitignore")


def repo_copy(dest: Path) -> Path:
    """Copy the files of EDITING_FILES into ``dest`` (created); returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in EDITING_FILES:
        source, target = ROOT / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        else:
            shutil.copy2(source, target)
    return dest


def make_lab_env(root: Path) -> dict[str, str]:
    """The variables the `lab` target of ``root``'s Makefile sets for JupyterLab (`make -n`)."""
    if shutil.which("make") is None:
        raise RuntimeError("make is not installed: `make lab` cannot be read")
    # (not the settings of a make that runs this test: `make test` sets MAKEFLAGS and MAKELEVEL)
    env = {k: v for k, v in os.environ.items()
           if k not in ("JUPYTER_CONFIG_PATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    printed = subprocess.run(["make", "-s", "-n", "--no-print-directory", "-o", ".venv/.lab-installed", "lab"],
                             cwd=root, env=env, capture_output=True, text=True, check=True).stdout
    line = next(l for l in printed.splitlines() if " lab " in f"{l} ")
    return dict(re.findall(r'(?:^|\s)([A-Z_]+)="([^"]*)"', line.split("jupyter lab")[0]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(root: Path, env_vars: dict[str, str], scratch: Path):
    """JupyterLab serving ``root`` from ``root`` (as `make lab` runs it from the repository), with
    ``env_vars`` added to the environment and its own settings under ``scratch``; yields its URL."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_CONFIG_PATH"}
    env.update(env_vars)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR", "JUPYTER_RUNTIME_DIR"):
        env[name] = str(scratch / name.lower())
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--IdentityProvider.token={TOKEN}", "--LabApp.extension_manager=readonly"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    scratch.mkdir(parents=True, exist_ok=True)
    log_path = scratch / "lab.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
                    break
                except urllib.error.HTTPError:
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"JupyterLab did not start:\n{log_path.read_text()[-3000:]}")
                    time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def api(url: str, path: str, body: dict | None = None) -> dict:
    """GET (or, with ``body``, PUT) ``/api/contents/<path>`` of the server at ``url``."""
    request = urllib.request.Request(
        f"{url}/api/contents/{path}" + ("" if body else "?content=1"), method="PUT" if body else "GET",
        data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())
