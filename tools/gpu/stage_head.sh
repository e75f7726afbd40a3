#!/usr/bin/env bash
# Stage the committed tree for a GPU call made while the working tree has uncommitted edits (yours or a helper's):
# the code of HEAD (fovi_lab without its records, tests, tools: ~0.6 MB) and the sha256 of each of its files.
#
#   bash tools/gpu/stage_head.sh                      # here: .device/head (head.tgz, sums, commit)
#   bash .device/head/apply.sh && bash tools/gpu/run.sh JOB      # there, in a call carrying .device/head
#
# apply.sh writes HEAD's files over the copied working tree and checks every one of them; tools/gpu/device_env.sh
# then takes the records' commit from .device/head/commit (with "+changes" where a check failed).
set -euo pipefail
git rev-parse --show-toplevel >/dev/null
grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
rm -rf .device/head && mkdir -p .device/head
tmp="$(mktemp -d)"
git archive HEAD fovi_lab tests tools | tar -x -C "$tmp"
(cd "$tmp" && tar --exclude=fovi_lab/records -czf - fovi_lab tests tools) > .device/head/head.tgz
(cd "$tmp" && find fovi_lab tests tools -type f ! -path 'fovi_lab/records/*' | sort | xargs sha256sum) > .device/head/sums
git rev-parse --short HEAD > .device/head/commit
cat > .device/head/apply.sh <<'APPLY'
#!/usr/bin/env bash
# HEAD's files over the working tree, then each checked; a failed check marks the commit "+changes".
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tar -xzf "$here/head.tgz" -C .
if sha256sum -c --quiet "$here/sums" > /tmp/head_check.log 2>&1; then
  echo "tree = $(cat "$here/commit")"
else
  echo "$(cat "$here/commit")+changes" > "$here/commit"; echo "tree differs:"; head -5 /tmp/head_check.log
fi
APPLY
rm -rf "$tmp"
echo "staged $(cat .device/head/commit): $(du -sh .device/head | cut -f1)"
