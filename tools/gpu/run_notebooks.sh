#!/usr/bin/env bash
# Execute notebooks with their gpu cells: bash tools/gpu/run_notebooks.sh [notebooks/XX.ipynb ...]
# The notebook dependencies come as cp312 wheels in .device/nb/wheels (pip download here); they are installed
# into /tmp/nbsite once per machine, so a later call on the same machine need not carry them.
set -uo pipefail
if [ ! -d /tmp/nbsite/plotly ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nbsite .device/nb/wheels/*.whl 2>&1 | tail -2
fi
export PYTHONPATH=/tmp/site:/tmp/nbsite:$PWD PYTHONUNBUFFERED=1 WARP_CACHE_PATH=/tmp/wpc/wpcache
export JUPYTER_PATH=/tmp/nbsite/share/jupyter
python3 -c "import plotly, ipywidgets, nbclient, ipykernel; print('nb deps ok')" || exit 1
python3 tools/gpu/run_notebooks.py "$@"
