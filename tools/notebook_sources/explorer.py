"""Source of notebooks/explorer.ipynb (built by tools/build_notebooks.py).

Not a lesson but the explorer app: `make explorer` serves it with Voila as a page of its own,
outputs only, no code. It is kept to a title and one call into the package.
"""

from build_notebooks import code, md

CELLS = [
    md("""
    # ampviz explorer
    """),
    code("""
    # Every explorer of the course on one page, a tab each. Served as a page without code by
    # `make explorer` (Voila), or run here in JupyterLab.
    from ampviz.widgets import ExplorerApp

    ExplorerApp()
    """),
]
