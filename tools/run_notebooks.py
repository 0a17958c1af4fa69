"""Refresh the stored outputs of course notebooks: sync, run in a fresh kernel, strip.

For each notebook chosen, this

1. syncs the pair ``notebooks/NN_topic.ipynb`` <-> ``notebook_scripts/NN_topic.py``
   (``jupytext --sync``: the side edited last gives the cells),
2. runs every cell in a fresh ``python3`` kernel of this environment,
3. strips it as the repository keeps it (``tools/strip_notebook.py``: outputs only on cells
   marked ``# NBVAL_CHECK_OUTPUT``, no widget state) and writes the .ipynb.

A cell that raises, or writes to stderr (a warning, say: nbval compares stderr in checked cells),
stops the run and leaves the notebook as it was.

    python tools/run_notebooks.py 01           # notebooks whose name starts with 01
    python tools/run_notebooks.py 01 04        # several
    python tools/run_notebooks.py explorer     # the explorer app
    python tools/run_notebooks.py              # every notebook
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT / "tools"))

import strip_notebook  # noqa: E402


class SlicedPollClient(NotebookClient):
    """nbclient, with the shell channel polled in slices of one second.

    With widget output, a cell's execute reply can arrive without waking the asyncio poll that
    waits for it (jupyter/nbclient#312); pyzmq then finds it only when that poll times out, after
    the whole cell timeout (300 s). Polling in slices bounds such a stall to a second.
    """

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        get_msg = kc.shell_channel.get_msg

        async def sliced_get_msg(timeout=None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = 1.0 if deadline is None else min(1.0, max(deadline - time.monotonic(), 0.0))
                try:
                    return await get_msg(timeout=left)
                except Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise

        kc.shell_channel.get_msg = sliced_get_msg
        return kc

    ipc_dir: str | None = None  # set by execute

    def create_kernel_manager(self):
        # The kernel's five channels on Unix sockets in a folder of its own, not on TCP ports: a
        # free port found by the manager can be taken by another kernel or server started at the
        # same moment (the suite runs two workers), and the kernel then dies with "Address already
        # in use" before the first cell.
        km = super().create_kernel_manager()
        if os.name == "posix" and self.ipc_dir:
            km.transport = "ipc"
            km.ip = os.path.join(self.ipc_dir, "k")
        return km


def execute(nb: nbformat.NotebookNode, timeout: int = 300, env: dict | None = None) -> nbformat.NotebookNode:
    """Run every cell of ``nb`` in place, in a fresh kernel of this environment, from notebooks/;
    ``env``: environment variables the kernel gets on top of this process's."""
    if not isinstance(nb, nbformat.NotebookNode):
        raise TypeError(f"execute needs an nbformat notebook (nbformat.read), not {type(nb).__name__}")
    env_path = os.path.dirname(sys.executable)
    os.environ["PATH"] = env_path + os.pathsep + os.environ.get("PATH", "")  # kernel = this env
    # store_widget_state=False would be the natural choice, but nbclient 0.11 then fails with a
    # KeyError when an ipywidgets.Output captures a display. The state it stores is removed by
    # the strip (metadata.widgets), so nothing of it is kept.
    client = SlicedPollClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                              record_timing=False, resources={"metadata": {"path": str(NOTEBOOKS)}})
    with tempfile.TemporaryDirectory(prefix="ampviz-kernel-") as client.ipc_dir:
        # measured (ampviz.text) refuses a value on a rounding boundary in an output being written
        client.execute(env={**os.environ, "AMPVIZ_STRICT_DIGITS": "1", **(env or {})})
    return nb


def _stderr_cells(nb) -> list[int]:
    """Indices of the code cells that wrote to stderr."""
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and any(o.get("output_type") == "stream" and o.get("name") == "stderr" for o in c.outputs)]


def sync(path: Path) -> None:
    """Bring a notebook and its paired script to the same cells (``jupytext --sync``); ``path``
    is either of them (a new script: Jupytext creates its notebook)."""
    from jupytext.cli import jupytext

    if not Path(path).is_file():
        raise ValueError(f"sync needs the path of an existing notebook or paired script, not {str(path)!r}")
    jupytext(["--sync", "--quiet", str(path)])


def refresh(path: Path) -> float:
    """Sync, run and strip one notebook; returns the seconds its cells took to run."""
    path = Path(path)
    if path.suffix != ".ipynb" or not path.is_file():
        raise ValueError(f"refresh needs the path of an existing .ipynb notebook, not {str(path)!r}")
    sync(path)
    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    try:
        execute(nb)
    except CellExecutionError as exc:
        raise SystemExit(f"{path.name}: a cell raised; nothing written.\n{exc}") from None
    bad = _stderr_cells(nb)
    for i in bad:
        text = "".join(o.text for o in nb.cells[i].outputs if o.get("name") == "stderr")
        print(f"{path.name}: cell {i} wrote to stderr:\n{text}", file=sys.stderr)
    if bad:
        raise SystemExit(f"{path.name}: stderr output in cells {bad}; nothing written.")
    seconds = time.perf_counter() - started
    path.write_text(strip_notebook.dumps(strip_notebook.strip(nb)), encoding="utf-8")
    return seconds


def matching(prefixes: list[str]) -> list[Path]:
    """The notebooks whose name starts with one of ``prefixes`` (all of them for none)."""
    if isinstance(prefixes, str) or not all(isinstance(x, str) for x in prefixes):
        raise TypeError(f"matching needs a list of name prefixes such as ['01', '04'], not {prefixes!r}")
    found = sorted(NOTEBOOKS.glob("*.ipynb"))
    if prefixes:
        found = [p for p in found if any(p.stem.startswith(x) for x in prefixes)]
    if not found:
        raise ValueError(f"no notebook in notebooks/ starts with {' or '.join(prefixes)}")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="run only notebooks whose name starts so (e.g. 01)")
    args = parser.parse_args(argv)
    try:
        paths = matching(args.prefixes)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    for path in paths:
        seconds = refresh(path)
        print(f"{path.relative_to(ROOT)}: ran in {seconds:.1f} s, stripped and written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
