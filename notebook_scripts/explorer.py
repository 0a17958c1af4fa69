# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # ampviz explorer

# %%
# Every explorer of the course on one page, a tab each. Served as a page without code by
# `make explorer` (Voila), or run here in JupyterLab.
from ampviz.widgets import ExplorerApp

ExplorerApp()
