"""Build the course notebooks from their sources, execute them, and strip them for committing.

Each notebook's cells live in ``tools/notebook_sources/NN_topic.py`` as a list ``CELLS`` of
``md("...")`` and ``code("...")`` entries; this script turns them into ``notebooks/NN_topic.ipynb``
(with stable cell ids, so rebuilding an unchanged source changes nothing), runs every cell in a
fresh ``python3`` kernel of this environment, and strips widget state and all outputs
except those of cells marked ``# NBVAL_CHECK_OUTPUT`` (see ``tools/strip_notebook.py``).

    python tools/build_notebooks.py              # all notebooks
    python tools/build_notebooks.py 01 02        # those whose name starts with 01 or 02
    python tools/build_notebooks.py explorer     # the explorer app (not a lesson)
    python tools/build_notebooks.py --no-execute # write unexecuted notebooks only

A cell that raises stops the build; anything a cell writes to stderr (a warning, say) is reported
and fails the build too, since nbval compares stderr in checked cells.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from queue import Empty

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "tools" / "notebook_sources"
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT / "tools"))

from strip_notebook import strip  # noqa: E402

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def md(text: str) -> tuple:
    """A markdown cell (leading/trailing blank lines and common indentation removed)."""
    return ("markdown", _clean(text))


def code(text: str) -> tuple:
    """A code cell."""
    return ("code", _clean(text))


def _clean(text: str) -> str:
    import textwrap
    return textwrap.dedent(text).strip("\n")


def load_source(path: Path):
    spec = importlib.util.spec_from_file_location(f"nbsource_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_notebook(name: str, cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, text) in enumerate(cells):
        cell = (nbformat.v4.new_markdown_cell(text) if kind == "markdown"
                else nbformat.v4.new_code_cell(text))
        cell["id"] = f"{name[:2]}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


class SlicedPollClient(NotebookClient):
    """nbclient, with the shell channel polled in slices of one second.

    With widget output, a cell's execute reply can arrive without waking the asyncio poll that
    waits for it (jupyter/nbclient#312); pyzmq then finds it only when that poll times out, after
    the whole cell timeout (300 s), and the run goes on as if nothing happened. Polling in slices
    bounds such a stall to a second.
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


def execute(nb: nbformat.NotebookNode, timeout: int = 300) -> nbformat.NotebookNode:
    env_path = os.path.dirname(sys.executable)
    os.environ["PATH"] = env_path + os.pathsep + os.environ.get("PATH", "")  # kernel = this env
    # store_widget_state=False would be the natural choice, but nbclient 0.11 then fails with a
    # KeyError when an ipywidgets.Output captures a display (every explorer does). The state it
    # stores is removed again by strip() (metadata.widgets), so nothing of it is committed.
    client = SlicedPollClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            record_timing=False, resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return nb


def stderr_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and any(o.get("output_type") == "stream" and o.get("name") == "stderr" for o in c.outputs)]


def build(source: Path, run: bool = True) -> Path:
    module = load_source(source)
    name = source.stem
    nb = make_notebook(name, module.CELLS)
    out = NOTEBOOKS / f"{name}.ipynb"
    if run:
        t = time.perf_counter()
        execute(nb)
        bad = stderr_cells(nb)
        if bad:
            for i in bad:
                text = "".join(o.text for o in nb.cells[i].outputs if o.get("name") == "stderr")
                print(f"{name}: cell {i} wrote to stderr:\n{text}", file=sys.stderr)
            raise SystemExit(f"{name}: stderr output in cells {bad}")
        print(f"{name}: executed in {time.perf_counter() - t:.1f} s")
    nb = nbformat.from_dict(strip(nb))
    nbformat.write(nb, out)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="build only notebooks whose name starts so")
    parser.add_argument("--no-execute", action="store_true")
    args = parser.parse_args(argv)
    sources = sorted(p for p in SOURCES.glob("*.py") if not p.name.startswith("_"))
    if args.prefixes:
        sources = [p for p in sources if any(p.stem.startswith(x) for x in args.prefixes)]
    if not sources:
        print("no notebook sources matched", file=sys.stderr)
        return 1
    NOTEBOOKS.mkdir(exist_ok=True)
    for src in sources:
        print(f"built {build(src, run=not args.no_execute).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
