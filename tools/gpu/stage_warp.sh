#!/usr/bin/env bash
# Stage warp-lang for the GPU machine in two parts instead of three: the wheel's contents without its examples and
# tests, xz-compressed (~98 MB for Warp 1.19.0 against the wheel's 149 MB), split in two. With the tracked tree
# (~15 MB) each call carries about 64 MB, under the 64 MiB limit, so the set-up takes two calls, the second of
# which also does the work:
#
#   bash tools/gpu/stage_warp.sh                 # here, from the project root (a few minutes: xz -9 on 2 cores)
#   bash .device/wt0/install.sh                   # call 1, carrying .device/wt0
#   bash .device/wt1/install.sh && bash tools/gpu/run.sh all      # call 2, carrying .device/wt1
#
# Each install.sh copies its part to /tmp/wparts on the GPU machine (kept while the machine stays up, ~30 s after a
# call); the second checks the sha256 and unpacks Warp into /tmp/site (device_env.sh puts it on PYTHONPATH).
set -euo pipefail
ver="${WARP_VERSION:-$(python3 -c 'import warp; print(warp.config.version)' 2>/dev/null || echo 1.19.0)}"
git rev-parse --show-toplevel >/dev/null
mkdir -p .device
grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
tmp="$(mktemp -d)"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp" "warp-lang==$ver"
mkdir "$tmp/x" && (cd "$tmp/x" && python3 -m zipfile -e "$tmp"/warp_lang-*.whl .)
xz -T0 -9 -c "$tmp/x/warp/bin/warp.so" > "$tmp/warp.so.xz"
(cd "$tmp/x" && tar --exclude=warp/examples --exclude=warp/tests --exclude=warp/bin/warp.so -cf - warp \
  warp_lang-*.dist-info | xz -T0 -9 > "$tmp/rest.tar.xz")
(cd "$tmp" && tar -cf blob.tar rest.tar.xz warp.so.xz)
sum="$(sha256sum "$tmp/blob.tar" | cut -d' ' -f1)"
size=$(stat -c %s "$tmp/blob.tar")
split -b $(( (size + 1) / 2 )) -d -a 1 "$tmp/blob.tar" "$tmp/bp."
for i in 0 1; do
  rm -rf ".device/wt$i"; mkdir -p ".device/wt$i"; mv "$tmp/bp.$i" ".device/wt$i/"
  cat > ".device/wt$i/install.sh" <<INSTALL
#!/usr/bin/env bash
# Warp $ver without its examples and tests, in two parts: copy this part to /tmp/wparts; once both are there,
# check the sha256 and unpack into /tmp/site (PYTHONPATH=/tmp/site).
set -euo pipefail
here="\$(cd "\$(dirname "\$0")" && pwd)"
[ -f /tmp/site/warp/bin/warp.so ] && { echo "warp already in /tmp/site"; exit 0; }
mkdir -p /tmp/wparts && cp "\$here"/bp.* /tmp/wparts/
if [ -f /tmp/wparts/bp.0 ] && [ -f /tmp/wparts/bp.1 ]; then
  cat /tmp/wparts/bp.0 /tmp/wparts/bp.1 > /tmp/wparts/blob.tar
  echo "$sum  /tmp/wparts/blob.tar" | sha256sum -c -
  mkdir -p /tmp/site && tar -C /tmp/wparts -xf /tmp/wparts/blob.tar
  python3 -c "import tarfile; tarfile.open('/tmp/wparts/rest.tar.xz').extractall('/tmp/site')"
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('/tmp/wparts/warp.so.xz'), open('/tmp/site/warp/bin/warp.so', 'wb'))"
  PYTHONPATH=/tmp/site python3 -c "import warp; print('warp', warp.config.version, 'in /tmp/site')"
else
  echo "part copied; run the other part's install.sh next"
fi
INSTALL
done
rm -rf "$tmp"
du -sh .device/wt0 .device/wt1
tree_kb=$(git ls-files -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
part_kb=$(du -k .device/wt0/bp.0 | cut -f1)
echo "staged Warp $ver (sha256 $sum) in 2 parts; a call carries the tree (~$((tree_kb / 1024)) MiB) + one part (~$((part_kb / 1024)) MiB) of the 64 MiB"
