#!/usr/bin/env bash
# Stage fovi and the pure-Python / binary modules fovi.arch imports (einops, scikit-image and its dependencies,
# trimesh) as cp312 wheels for the GPU machine, which has PyTorch and numpy but no package index, so that
# `python -m fovi_lab bench network` and the fovi baselines can run there:
#
#   bash tools/gpu/stage_fovi.sh                  # here, from the project root: .device/fovi (wheels + install.sh)
#   bash .device/fovi/install.sh                  # there, in a call carrying .device/fovi (after the Warp set-up)
#
# FOVI_SKIP: wheels the GPU machine already has, left out to stay under the 64 MiB a call carries. The default is
# what the lent machines' image holds (numpy, scipy, scikit-image and its dependencies, einops): what is left is fovi
# and trimesh, ~1 MiB, which rides along with a Warp part. The wheels install with --no-deps into /tmp/site, which
# tools/gpu/device_env.sh puts on PYTHONPATH.
set -euo pipefail
git rev-parse --show-toplevel >/dev/null
skip="${FOVI_SKIP:-numpy scipy scikit_image einops imageio lazy_loader networkx packaging pillow tifffile}"
rm -rf .device/fovi && mkdir -p .device/fovi/wheels
grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q "${plat[@]}" -d .device/fovi/wheels einops "scikit-image>=0.21" "trimesh>=4"
python3 -m pip download -q --no-deps "${plat[@]}" -d .device/fovi/wheels "fovi==2.4.0"
for name in $skip; do rm -f .device/fovi/wheels/"${name}"-*.whl; done
cat > .device/fovi/install.sh <<'INSTALL'
#!/usr/bin/env bash
# fovi and what fovi.arch imports, from the wheels beside this file, into /tmp/site (no index, no dependencies).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$here"/wheels/*.whl
PYTHONPATH=/tmp/site python3 -c "import fovi.arch.knn, fovi; print('fovi', fovi.__version__, 'in /tmp/site')"
INSTALL
du -sh .device/fovi
ls .device/fovi/wheels
