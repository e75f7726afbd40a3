# fovi-lab developer targets. Run from the repository root with the environment active
# (or pass PYTHON=/path/to/python).

PYTHON ?= python

# `make screenshot` opens SCREENSHOT_NB in JupyterLab (headless Chromium), runs every cell, checks for
# errors and writes a PNG of the whole notebook to SCREENSHOT_PNG: by default
# build/screenshots/<notebook name>.png, a git-ignored folder (never a tracked file). Overrides:
#   make screenshot SCREENSHOT_NB=notebooks/01_foveated_knn_graph.ipynb
#   make screenshot SCREENSHOT_PNG=/tmp/05.png SCREENSHOT_ARGS="--viewport --scroll-to widget"
# `make screenshots` does every notebook in notebooks/ (a plot / a widget is required only where the
# stored notebook shows one), goes on past a failure and lists the failures at the end.
# Needs Debian's chromium and `pip install playwright` (no `playwright install`).
SCREENSHOT_DIR ?= build/screenshots
SCREENSHOT_NB ?= notebooks/07_training.ipynb
SCREENSHOT_PNG ?= $(SCREENSHOT_DIR)/$(basename $(notdir $(SCREENSHOT_NB))).png
SCREENSHOT_ARGS ?=
SCREENSHOT_TOOL = $(PYTHON) tools/screenshot_notebook.py
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))

.PHONY: screenshot screenshots
screenshot: ## run every cell of SCREENSHOT_NB in JupyterLab, check for errors, write a full-page PNG
	$(SCREENSHOT_TOOL) $(SCREENSHOT_NB) $(SCREENSHOT_PNG) $(SCREENSHOT_ARGS)

screenshots: ## the same for every notebook in notebooks/, PNGs in SCREENSHOT_DIR
	@failed=; \
	$(foreach nb,$(NOTEBOOKS),echo "== $(nb)"; \
	  $(SCREENSHOT_TOOL) $(nb) $(SCREENSHOT_DIR)/$(basename $(notdir $(nb))).png --require-stored $(SCREENSHOT_ARGS) \
	  || failed="$$failed $(nb)";) \
	if [ -n "$$failed" ]; then echo "screenshots: failed:$$failed" >&2; exit 1; fi; \
	echo "screenshots: all $(words $(NOTEBOOKS)) notebooks ok, PNGs in $(SCREENSHOT_DIR)/"
