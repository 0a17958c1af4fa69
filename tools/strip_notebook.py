"""Strip notebooks for committing: outputs stay only where they are the lesson.

A code cell whose source has a line that is exactly ``# NBVAL_CHECK_OUTPUT`` keeps its outputs and
an execution count (nbval compares them; it needs both). Every other code cell loses its outputs
and execution count. Timing metadata that executors write into cells, and the notebook-level
widget state (``metadata.widgets``), are removed everywhere.

What is kept does not depend on how, where or how often the cells ran, so that Run All and Save
in JupyterLab rewrite a committed notebook byte for byte:

- a checked cell's execution count is its position among the code cells (1 for the first code
  cell), the count a Run All in a fresh kernel gives it, however often it was run since;
- consecutive stream outputs of one name are joined into one, as JupyterLab shows them (the
  kernel splits a cell's printing into messages by timing);
- the Python version in ``metadata.language_info`` is removed (it differs between machines).

The course's JupyterLab applies the same to every notebook it saves under ``notebooks/`` (the
pre-save hook in ``jupyter_server_config.py``).

    python tools/strip_notebook.py                 # every notebooks/*.ipynb
    python tools/strip_notebook.py a.ipynb b.ipynb
    python tools/strip_notebook.py --check         # exit 1 if any notebook would change
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

CHECK_MARKER = "# NBVAL_CHECK_OUTPUT"
#: Cell metadata keys that executors and editors add and that only make diffs noisy.
VOLATILE_CELL_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled")
ROOT = Path(__file__).resolve().parent.parent


def is_checked(cell) -> bool:
    """True for a code cell with a line exactly ``# NBVAL_CHECK_OUTPUT`` (nbval's rule)."""
    source = cell.get("source", "")
    if isinstance(source, list):
        source = "".join(source)
    return cell.get("cell_type") == "code" and any(
        line.strip() == CHECK_MARKER for line in source.splitlines())


def strip(nb: dict) -> dict:
    """A stripped copy of a notebook (as a JSON dict or an ``nbformat`` node)."""
    nb = copy.deepcopy(nb)
    strip_in_place(nb)
    return nb


def strip_in_place(nb: dict) -> None:
    """Strip a notebook (a JSON dict or an ``nbformat`` node) in place, as :func:`strip` does."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells", []), list):
        raise TypeError(f"strip needs a notebook as a dict with a list of cells, not {type(nb).__name__}")
    meta = nb.get("metadata", {})
    meta.pop("widgets", None)
    if isinstance(meta.get("language_info"), dict):
        meta["language_info"].pop("version", None)
    position = 0
    for cell in nb.get("cells", []):
        cell_meta = cell.get("metadata", {})
        for key in VOLATILE_CELL_METADATA:
            cell_meta.pop(key, None)
        if cell.get("cell_type") != "code":
            continue
        position += 1
        if not is_checked(cell):
            cell["outputs"] = []
            cell["execution_count"] = None
            continue
        cell["execution_count"] = position
        cell["outputs"] = _join_streams(cell.get("outputs", []))
        for out in cell["outputs"]:
            if out.get("output_type") == "execute_result":
                out["execution_count"] = position


def _text(text) -> str:
    return "".join(text) if isinstance(text, list) else text


def _join_streams(outputs: list) -> list:
    """Consecutive stream outputs of one name (stdout, stderr) joined into one."""
    joined = []
    for out in outputs:
        last = joined[-1] if joined else None
        if (out.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                and last.get("name") == out.get("name")):
            last["text"] = _text(last.get("text", "")) + _text(out.get("text", ""))
        else:
            joined.append(out)
    return joined


def strip_file(path: Path, check_only: bool = False) -> bool:
    """Strip one file in place; returns True if it changed (or, with check_only, would change).

    The file is written as Jupyter writes notebooks (``nbformat.write``: keys sorted, one-space
    indent, multi-line strings as lists of lines), so JupyterLab saving it again changes nothing."""
    text = Path(path).read_text(encoding="utf-8")
    new = dumps(strip(json.loads(text)))
    changed = new != text
    if changed and not check_only:
        Path(path).write_text(new, encoding="utf-8")
    return changed


def dumps(nb: dict) -> str:
    """A notebook's file text, exactly as ``nbformat.write`` (and so the Jupyter server) writes it."""
    import nbformat

    if not isinstance(nb, dict):
        raise TypeError(f"dumps needs a notebook as a dict, not {type(nb).__name__}")
    text = nbformat.writes(nbformat.from_dict(nb), version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="report, do not write")
    args = parser.parse_args(argv)
    paths = args.paths or sorted((ROOT / "notebooks").glob("*.ipynb"))
    changed = [p for p in paths if strip_file(p, check_only=args.check)]
    for p in changed:
        print(f"{'would strip' if args.check else 'stripped'} {p}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
