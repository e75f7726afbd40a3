#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nbsite .device/nb/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:/tmp/nbsite:$PWD PYTHONUNBUFFERED=1 WARP_CACHE_PATH=/tmp/wpc/wpcache
export JUPYTER_PATH=/tmp/nbsite/share/jupyter
python3 -c "import plotly, ipywidgets, nbclient, ipykernel; print('nb deps ok')"
python3 tools/h200/run_notebooks.py
