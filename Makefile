# ampviz: `make lab` opens the course, `make explorer` the explorer app, `make test` runs the whole
# test suite.
# Both create and fill a local virtual environment (.venv) first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# A kernel starts in about 1 s on 2 cores even with 4 busy processes beside it; nbval's 60 s default
# was still lost once to a start-up under heavy load, so the course's notebooks wait up to 180 s.
NBVAL  := --nbval-lax --nbval-current-env --nbval-cell-timeout=300 --nbval-kernel-startup-timeout=180 \
          --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: lab explorer site test bench clean browser-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Runtime packages + ampviz itself (editable), for JupyterLab.
# JupyterLab's settings for the course (tools/jupyterlab_overrides.json: no news toast over the
# notebook) go where JupyterLab reads overrides, the environment's own settings folder.
$(VENV)/.lab-installed: requirements.txt pyproject.toml tools/jupyterlab_overrides.json | $(BIN)/python
	@echo "Installing the course's packages into $(VENV) (the first time: a few minutes; pip shows its progress)"
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on -r requirements.txt -e .
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp tools/jupyterlab_overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $@

# Everything the test suite needs on top.
$(VENV)/.test-installed: requirements-dev.txt $(VENV)/.lab-installed
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

# The explorer app's Voila page template (share/jupyter/voila/templates/ampviz: Voila's lab page
# with nothing fetched from outside, and plotly.js served by the page), installed where Voila looks
# for templates, with the installed plotly package's plotly.min.js in its static folder. voila.json
# names it, so every Voila (make explorer, the lab's Voila preview, the browser tests) needs it.
VOILA_TEMPLATE := share/jupyter/voila/templates/ampviz
$(VENV)/$(VOILA_TEMPLATE)/.installed: $(wildcard $(VOILA_TEMPLATE)/*) $(VENV)/.lab-installed
	rm -rf $(VENV)/$(VOILA_TEMPLATE)
	mkdir -p $(VENV)/$(VOILA_TEMPLATE)/static
	cp -R $(VOILA_TEMPLATE)/. $(VENV)/$(VOILA_TEMPLATE)/
	$(BIN)/python -c "import plotly, pathlib, shutil; shutil.copy(pathlib.Path(plotly.__file__).parent / 'package_data' / 'plotly.min.js', '$(VENV)/$(VOILA_TEMPLATE)/static/')"
	touch $@

# Bound to 127.0.0.1 with token authentication (JupyterLab's default); --allow-root only for root.
# The link it prints opens 00_start_here (not the Launcher).
# This folder goes first on Jupyter's config path, so that the server reads the course's
# jupyter_server_config.py: a notebook saved under notebooks/ keeps only its checked outputs, and
# Jupytext (jupytext.toml) writes its paired script in notebook_scripts/.
LAB_ARGS := --ip 127.0.0.1 --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb
LAB_CONFIG_PATH := $(CURDIR)$(if $(JUPYTER_CONFIG_PATH),:$(JUPYTER_CONFIG_PATH))
lab: $(VENV)/.lab-installed $(VENV)/$(VOILA_TEMPLATE)/.installed
	JUPYTER_CONFIG_PATH="$(LAB_CONFIG_PATH)" $(BIN)/jupyter lab $(LAB_ARGS) $(if $(filter 0,$(shell id -u)),--allow-root)

# The explorer app as a page of its own (Voila: outputs only, no code), on 127.0.0.1 with a fresh
# token. Voila masks the token in its own log, so the link with it is printed here first. Voila reads
# voila.json from this directory: it shuts down the kernel of a page that was closed or reloaded,
# it leaves out Jupytext's lab extension (it needs JupyterLab's document manager, which Voila's
# page does not have: the page's console showed an error), and it draws the page with the course's
# template (share/jupyter/voila/templates/ampviz: Voila's lab page with nothing fetched from
# outside, so the app works offline, and plotly.js loaded by the page itself). The template is
# copied where Voila looks for templates, the environment's share/jupyter, with the installed
# plotly package's plotly.min.js in its static folder.
EXPLORER_PORT ?= 8866
explorer: $(VENV)/$(VOILA_TEMPLATE)/.installed
	@token=$$($(BIN)/python -c "import secrets; print(secrets.token_hex(16))"); \
	echo "The explorer app: http://127.0.0.1:$(EXPLORER_PORT)/?token=$$token"; \
	$(BIN)/voila --Voila.ip=127.0.0.1 --port=$(EXPLORER_PORT) --Voila.port_retries=0 \
		--token=$$token notebooks/explorer.ipynb

# Debian's Chromium for the real-browser tests (tests/browser): installed when missing, as root.
# The course as a static site in site/: every lesson as a page, the explorers that compute in the
# browser live in it (no kernel), plotly.js beside the pages; open site/index.html, offline.
site: $(VENV)/.test-installed
	$(BIN)/python tools/build_site.py site

browser-deps:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# Two pytest workers: most tests use one core, and the long ones (the Binder environment, the
# lessons' runs) start first on one worker while the other takes the rest (tests/conftest.py).
test: $(VENV)/.test-installed $(VENV)/$(VOILA_TEMPLATE)/.installed browser-deps
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests
	AMPVIZ_STRICT_DIGITS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile $(NBVAL) notebooks

bench: $(VENV)/.test-installed $(VENV)/$(VOILA_TEMPLATE)/.installed browser-deps
	$(BIN)/python bench/bench_census.py
	$(BIN)/python bench/bench_scaling.py
	$(BIN)/python bench/bench_blocks.py
	$(BIN)/python bench/bench_scaler_lab.py
	$(BIN)/python bench/bench_live.py
	$(BIN)/python bench/bench_browser.py
	$(BIN)/python bench/bench_page_explorers.py
	$(BIN)/python bench/bench_voila_open.py
	$(BIN)/python bench/bench_gpu.py
	$(BIN)/python bench/bench_ranks.py

clean:
	rm -rf $(VENV)
