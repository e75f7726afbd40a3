# fovi-lab developer targets. Run from the repository root with the environment active
# (or pass PYTHON=/path/to/python).

PYTHON ?= python

# Notebook that `make screenshot` opens in JupyterLab (headless Chromium); the PNG goes to
# data/screenshots/<notebook name>.png. Override: make screenshot SCREENSHOT_NB=notebooks/00_foveated_knn_graph.ipynb
SCREENSHOT_NB ?= notebooks/05_training.ipynb
SCREENSHOT_PNG ?= data/screenshots/$(basename $(notdir $(SCREENSHOT_NB))).png

.PHONY: screenshot
screenshot: ## run every cell of SCREENSHOT_NB in JupyterLab, check for errors, write a PNG
	@mkdir -p $(dir $(SCREENSHOT_PNG))
	$(PYTHON) tools/screenshot_notebook.py $(SCREENSHOT_NB) $(SCREENSHOT_PNG)
