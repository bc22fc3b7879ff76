#!/usr/bin/env bash
# Packs what a GPU machine without internet lacks, before a loan of it: the workplace's kit
# (../shared/gpu: pack.sh, on-device.sh, and a README.md saying how the device calls go) with the
# project's own list of wheels, scripts/gpu_wheels.txt, in place of the kit's. The project keeps
# that list (with the machine's image, scripts/gpu_image.txt) because its dependencies change with
# it: tests/test_scripts.py fails when an installed dependency of the project is in neither file.
#
#   PYTHON=.venv/bin/python bash scripts/gpu_pack.sh [KIT]     # KIT: the kit's folder, default ../shared/gpu
#
# It fills .device/ (ignored through .git/info/exclude) and prints the device calls to make.
set -euo pipefail
KIT=${1:-../shared/gpu}
for file in pack.sh on-device.sh; do
  if [ ! -f "$KIT/$file" ]; then
    echo "error: $KIT/$file not found (give the GPU kit's folder as the first argument)" >&2
    exit 2
  fi
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -d .git ]; then  # the kit appends to .git/info/exclude, which a fresh clone may lack
  mkdir -p .git/info
  grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
fi
mkdir -p .device/kit
cp "$KIT/pack.sh" "$KIT/on-device.sh" .device/kit/
# The kit reads its wheels.txt beside pack.sh, one NAME==VERSION a line: no comments.
grep -v -e '^#' -e '^[[:space:]]*$' "$ROOT/scripts/gpu_wheels.txt" > .device/kit/wheels.txt
exec bash .device/kit/pack.sh
