"""Binder: the course must build and run from the files in ``binder/`` alone.

repo2docker ignores the repository's root files once a ``binder/`` folder exists, so
``binder/requirements.txt`` has to repeat every pin of ``requirements.txt`` (with PyTorch's
CPU-only torch), and ``binder/postBuild`` installs ampviz itself. Without Docker, the heavy
test below does what repo2docker does: a fresh Python 3.11 virtual environment, ``pip install -r
binder/requirements.txt``, ``binder/postBuild`` from a copy of the repository, and then every
notebook run top to bottom in that environment's own kernel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from checked_outputs import differences, variant_env

ROOT = Path(__file__).resolve().parents[2]
VARIANT = "AVX2 kernels, 2 threads"
BINDER = ROOT / "binder"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXTENSIONS = ("@jupyter-widgets/jupyterlab-manager", "anywidget", "jupyterlab-plotly", "jupyterlab-jupytext")
CELL_TIMEOUT_S = 300

# What the copy of the repository leaves out: the local environment, git, build output, caches.
COPY_IGNORE = {".venv", ".git", "build", "dist", "__pycache__", ".ipynb_checkpoints", ".hypothesis",
               ".pytest_cache", "node_modules", "lightning_logs"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lines(path: Path) -> list[str]:
    """Requirement lines without comments and blank lines."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _pins(path: Path) -> dict[str, str]:
    """``name==version`` lines as {normalised name: version}; option lines (``-r``, ``--...``) skipped."""
    pins = {}
    for line in _lines(path):
        if line.startswith("-"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        assert m, f"{path.relative_to(ROOT)}: not an exact pin: {line!r}"
        pins[_norm(m.group(1))] = m.group(2)
    return pins


# --- cheap checks of the binder/ files --------------------------------------------------------

def test_binder_requirements_pin_the_course_versions():
    course, binder = _pins(ROOT / "requirements.txt"), _pins(BINDER / "requirements.txt")
    missing = sorted(set(course) - set(binder))
    assert not missing, f"binder/requirements.txt lacks {missing}: Binder ignores the root requirements.txt"
    for name, version in course.items():
        want = f"{version}+cpu" if name == "torch" else version
        assert binder[name] == want, f"binder/requirements.txt pins {name}=={binder[name]}, the course {version}"
    assert binder["voila"], "voila serves the explorer app"
    # repo2docker's base environment has Notebook 7, which requires one JupyterLab minor version
    # (Notebook 7.N with JupyterLab 4.N): upgrading JupyterLab must upgrade it too.
    lab_minor = binder["jupyterlab"].split(".")[1]
    assert binder.get("notebook", "").split(".")[:2] == ["7", lab_minor], (
        f"binder/requirements.txt needs notebook==7.{lab_minor}.* beside jupyterlab=={binder['jupyterlab']}")


def test_binder_requirements_take_cpu_torch_and_leave_ampviz_to_postbuild():
    lines = _lines(BINDER / "requirements.txt")
    assert f"--extra-index-url {PYTORCH_CPU_INDEX}" in lines
    local = [l for l in lines if l in (".", "./") or l.startswith(("-e", "--editable", "file:", "./", "../"))]
    assert not local, f"no local install in binder/requirements.txt (postBuild installs ampviz): {local}"


def test_binder_runtime_is_python_311():
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"


def test_binder_postbuild_is_an_executable_strict_bash_script():
    post = BINDER / "postBuild"
    text = post.read_text()
    assert os.access(post, os.X_OK), "binder/postBuild must be executable (chmod +x)"
    assert text.splitlines()[0] in ("#!/usr/bin/env bash", "#!/bin/bash")
    assert "set -euo pipefail" in text
    # Once committed, git must keep the executable bit too.
    try:
        staged = subprocess.run(["git", "ls-files", "-s", "binder/postBuild"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        staged = ""
    if staged:
        assert staged.startswith("100755"), f"git records binder/postBuild without +x: {staged}"


@pytest.mark.parametrize("before", [None, "/elsewhere/etc/jupyter"])
def test_binder_start_puts_the_repository_on_jupyters_config_path(tmp_path, before):
    """binder/start (run by repo2docker before the server, with its command as arguments) puts the
    repository first on JUPYTER_CONFIG_PATH, as `make lab` does, so that JupyterLab reads the
    course's jupyter_server_config.py (the pre-save hook); then it runs the command."""
    start = BINDER / "start"
    assert os.access(start, os.X_OK), "binder/start must be executable (chmod +x)"
    text = start.read_text()
    assert text.splitlines()[0] in ("#!/usr/bin/env bash", "#!/bin/bash") and "set -euo pipefail" in text
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_CONFIG_PATH"}
    if before:
        env["JUPYTER_CONFIG_PATH"] = before
    probe = "import os, sys; print(os.environ['JUPYTER_CONFIG_PATH']); sys.exit(7)"
    run = subprocess.run([str(start), sys.executable, "-c", probe], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 7, run.stderr  # the command ran, and its exit status came through
    paths = run.stdout.strip().split(os.pathsep)
    assert paths == [str(ROOT)] + ([before] if before else [])
    assert (Path(paths[0]) / "jupyter_server_config.py").is_file()
    try:  # once committed, git must keep the executable bit too
        staged = subprocess.run(["git", "ls-files", "-s", "binder/start"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        staged = ""
    if staged:
        assert staged.startswith("100755"), f"git records binder/start without +x: {staged}"


def test_readme_launch_links_open_existing_notebooks():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"https://mybinder\.org/v2/gh/([\w.-]+/[\w.-]+)/HEAD\?urlpath=(lab/tree|voila/render)/"
                       r"([\w./-]+\.ipynb)\)", readme)
    targets = {kind: path for _, kind, path in links}
    assert targets.get("lab/tree") == "notebooks/00_start_here.ipynb", "the badge opens the course index"
    assert targets.get("voila/render") == "notebooks/explorer.ipynb", "a Voila link opens the explorer app"
    assert len({repo for repo, _, _ in links}) == 1, f"all launch links name one repository: {links}"
    assert "[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/" in readme
    for path in targets.values():
        assert (ROOT / path).is_file(), f"README launches {path}, which does not exist"


def _fake_listing(states: dict[str, str]) -> str:
    """What ``jupyter labextension list`` writes to stderr, colours included."""
    green, red, reset = "\x1b[32m", "\x1b[31m", "\x1b[0m"
    rows = [f"        {name} v1.0.0 {green if s == 'enabled' else red}{s}{reset} {green}OK{reset}"
            for name, s in states.items()]
    return "JupyterLab v4.6.6\n/env/share/jupyter/labextensions\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize("states, problem", [
    ({e: "enabled" for e in EXTENSIONS}, None),
    ({"@jupyter-widgets/jupyterlab-manager": "enabled", "jupyterlab-plotly": "enabled"}, "anywidget"),
    ({**{e: "enabled" for e in EXTENSIONS}, "jupyterlab-plotly": "disabled"}, "jupyterlab-plotly"),
])
def test_postbuild_checks_the_lab_extensions(tmp_path, states, problem):
    """postBuild's extension check, against stand-in ``python`` and ``jupyter`` commands."""
    repo = tmp_path / "repo"
    shutil.copytree(BINDER, repo / "binder")
    (repo / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "jupyterlab_overrides.json", repo / "tools")
    shutil.copytree(ROOT / "share", repo / "share")  # the explorer app's Voila template
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    prefix = tmp_path / "prefix"  # what the stand-in python says sys.prefix is
    (bin_dir / "python").write_text(f"#!/bin/sh\necho '{prefix}'\n")
    (tmp_path / "listing").write_text(_fake_listing(states))
    (bin_dir / "jupyter").write_text(f"#!/bin/sh\ncat '{tmp_path / 'listing'}' >&2\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run([str(repo / "binder" / "postBuild")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    if problem is None:
        assert run.returncode == 0, run.stderr
        # the course's JupyterLab settings (no news toast) where JupyterLab reads overrides
        installed = prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
        assert installed.read_text() == (ROOT / "tools" / "jupyterlab_overrides.json").read_text()
        # the explorer app's Voila template (voila.json names it) where Voila looks for templates
        template = prefix / "share" / "jupyter" / "voila" / "templates" / "ampviz"
        source = ROOT / "share" / "jupyter" / "voila" / "templates" / "ampviz"
        assert (template / "index.html.j2").read_text() == (source / "index.html.j2").read_text()
        assert (template / "static").is_dir()
    else:
        assert run.returncode != 0
        assert f"JupyterLab extension {problem} is missing, disabled or broken" in run.stderr


# --- the heavy test: a fresh environment from binder/ alone -----------------------------------

def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the Binder test must run)")
    pytest.skip(reason)


def _tail(text: str, n: int = 4000) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


def _copy_repo(dest: Path) -> None:
    """The working tree (uncommitted files included) without the local env, git and build output."""
    def ignore(directory, names):
        skip = {n for n in names if n in COPY_IGNORE or n.endswith(".egg-info")}
        if Path(directory).resolve() == ROOT / "tests" / "browser":
            skip.add("output")
        return skip
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)


@pytest.fixture(scope="module")
def binder_env(tmp_path_factory):
    """A fresh venv filled from binder/requirements.txt, then binder/postBuild run in a repo copy."""
    candidates = [shutil.which("python3.11")]
    if sys.version_info[:2] == (3, 11):
        candidates.append(sys.executable)
    python = next((c for c in candidates if c), None)
    if python is None:
        _unavailable("no python3.11 to build the Binder environment with (binder/runtime.txt asks for 3.11)")

    tmp = tmp_path_factory.mktemp("binder")
    venv = tmp / "venv"
    made = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        _unavailable(f"{python} -m venv does not work here: {made.stderr.strip()[-500:]}")

    repo = tmp / "repo"
    _copy_repo(repo)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update({
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv),
        # Kernel specs and IPython profiles only from the fresh env, never from this user's dirs.
        "JUPYTER_DATA_DIR": str(tmp / "jupyter-data"),
        "JUPYTER_CONFIG_DIR": str(tmp / "jupyter-config"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "PIP_NO_INPUT": "1",
        # binder/requirements.txt names PyTorch's CPU index. Where that index cannot be reached,
        # pip fails each lookup at once but retries it 5 times with back-off: about 7 s for each
        # of the ~120 packages, a quarter of an hour in all. Without retries it costs nothing,
        # and torch 2.13.0+cpu must then come from pip's other sources (e.g. a find-links folder).
        "PIP_RETRIES": "0",
    })

    started = time.monotonic()
    # --no-compile: no bytecode written at install time (torch alone has thousands of modules); the
    # kernels compile what they import, once.
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
                          "-r", "binder/requirements.txt"],
                         cwd=repo, env=env, capture_output=True, text=True)
    assert pip.returncode == 0, f"pip install -r binder/requirements.txt failed:\n{_tail(pip.stderr)}"
    post = subprocess.run([str(repo / "binder" / "postBuild")], cwd=repo, env=env,
                          capture_output=True, text=True)
    assert post.returncode == 0, (f"binder/postBuild failed:\n{_tail(post.stdout, 2000)}\n"
                                  f"{_tail(post.stderr)}")
    assert "binder/postBuild: ampviz installed" in post.stdout
    leftovers = [p.name for p in (repo / "build", repo / "ampviz.egg-info") if p.exists()]
    assert not leftovers, f"binder/postBuild leaves {leftovers} in the repository"
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], env=env,
                           capture_output=True, text=True)
    assert check.returncode == 0, f"binder/requirements.txt installs conflicting versions:\n{check.stdout}"
    print(f"Binder environment built in {time.monotonic() - started:.0f} s")
    yield {"venv": venv, "repo": repo, "env": env, "tmp": tmp}
    # 1.3 GB (pytest would keep the last three runs' copies), removed in the background: waiting for
    # it cost the suite 25 s.
    subprocess.run(["sh", "-c", 'rm -rf "$1" >/dev/null 2>&1 &', "sh", str(tmp)], check=False)


# Runs inside the fresh environment (its own nbclient): one notebook, with a last cell appended
# that reports the kernel's sys.prefix; writes what happened as JSON.
#
# After a cell that displays widgets, zmq.asyncio's poll now and then misses the wake-up for a
# reply that has already arrived, and nbclient then waits out the whole cell timeout (300 s) before
# reading it (jupyter/nbclient#312). Polling the channels in 1-second slices bounds that at 1 s.
RUNNER = textwrap.dedent("""
    import json, os, sys, time
    from queue import Empty
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path, out, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def in_slices(get_msg):
        async def sliced(timeout=None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                try:
                    return await get_msg(timeout=min(1.0, max(left, 0.001)))
                except Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise
        return sliced

    def poll_in_slices(**_):
        for channel in (client.kc.shell_channel, client.kc.iopub_channel):
            channel.get_msg = in_slices(channel.get_msg)

    nb = nbformat.read(path, as_version=4)
    probe = nbformat.v4.new_code_cell("import sys; print(sys.prefix)")
    nb.cells.append(probe)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", on_notebook_start=poll_in_slices,
                            resources={"metadata": {"path": os.path.dirname(path)}})
    started, failure = time.monotonic(), None
    try:
        client.execute()
    except CellExecutionError as exc:
        failure = str(exc)
    errors = [f"cell {i}: {o.ename}: {o.evalue}" for i, c in enumerate(nb.cells)
              if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    prefix = "".join(o.get("text", "") for o in probe.outputs if o.output_type == "stream").strip()
    nb.cells.remove(probe)
    nbformat.write(nb, out + ".ipynb")
    with open(out, "w") as f:
        json.dump({"failure": failure, "errors": errors, "kernel_prefix": prefix,
                   "seconds": time.monotonic() - started}, f)
""")


def _run_notebook(binder_env, notebook: Path) -> dict:
    tmp = binder_env["tmp"]
    env = {**binder_env["env"], **variant_env(VARIANT, tmp / "variant")}
    runner = tmp / "run_notebook.py"
    out = tmp / f"{notebook.stem}.json"
    proc = subprocess.run([str(binder_env["venv"] / "bin" / "python"), str(runner), str(notebook), str(out),
                           str(CELL_TIMEOUT_S)], cwd=notebook.parent, env=env, capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0 or not out.exists():
        return {"failure": f"runner exited {proc.returncode}:\n{_tail(proc.stderr)}", "errors": [],
                "kernel_prefix": "", "seconds": 0.0, "differences": []}
    stored = json.loads(notebook.read_text())["cells"]
    run = json.loads(Path(f"{out}.ipynb").read_text())["cells"]
    return {**json.loads(out.read_text()), "differences": differences(stored, run)}


def test_every_notebook_runs_in_the_binder_environment_as_on_another_machine(binder_env):
    """Every notebook, top to bottom, in the fresh environment's own kernel, which computes as
    another machine would (tests/checked_outputs.py: AVX2 kernels, 2 threads): no cell raises and
    every checked cell's outputs equal the stored ones."""
    notebooks = sorted((binder_env["repo"] / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 9
    (binder_env["tmp"] / "run_notebook.py").write_text(RUNNER)
    # Two at a time: most of a notebook's time is its kernel starting and importing torch.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip((nb.name for nb in notebooks),
                           pool.map(lambda nb: _run_notebook(binder_env, nb), notebooks)))

    venv = os.path.realpath(binder_env["venv"])
    problems = []
    for name, r in results.items():
        print(f"{name}: {r['seconds']:.0f} s")
        if r["failure"] or r["errors"]:
            traceback = re.sub(r"\x1b\[[0-9;]*m", "", r["failure"] or "")  # IPython colours it
            problems.append(f"{name}: {'; '.join(r['errors'])}\n{_tail(traceback, 3000)}")
        elif r["differences"]:
            problems.append(f"{name}, checked outputs with {VARIANT}:\n" + "\n".join(r["differences"]))
        elif os.path.realpath(r["kernel_prefix"]) != venv:
            problems.append(f"{name}: the kernel ran in {r['kernel_prefix']!r}, not the fresh env {venv}")
    assert not problems, "\n\n".join(problems)
