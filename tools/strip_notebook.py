"""Strip notebooks for committing: outputs stay only where they are the lesson.

A code cell whose source has a line that is exactly ``# NBVAL_CHECK_OUTPUT`` keeps its outputs and
its execution count (nbval compares them; it needs both). Every other code cell loses its outputs
and execution count. Timing metadata that executors write into cells, and the notebook-level
widget state (``metadata.widgets``), are removed everywhere.

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
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {})
        for key in VOLATILE_CELL_METADATA:
            meta.pop(key, None)
        if cell.get("cell_type") != "code":
            continue
        if not is_checked(cell):
            cell["outputs"] = []
            cell["execution_count"] = None
        else:
            for out in cell.get("outputs", []):
                if out.get("output_type") == "execute_result":
                    out["execution_count"] = cell.get("execution_count")
    return nb


def strip_file(path: Path, check_only: bool = False) -> bool:
    """Strip one file in place; returns True if it changed (or, with check_only, would change)."""
    text = Path(path).read_text(encoding="utf-8")
    nb = json.loads(text)
    new = json.dumps(strip(nb), indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    changed = new != text
    if changed and not check_only:
        Path(path).write_text(new, encoding="utf-8")
    return changed


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
