#!/usr/bin/env bash
# tools/nccl_preload.sh VERSION COMMAND...: runs COMMAND with NCCL VERSION loaded in every process it starts ahead of
# any other libnccl (LD_PRELOAD; torch runs on it unchanged), for testing one build on several NCCL releases on a
# machine without PyPI (the GPU machines). The library comes from $NCCL_EXT_NCCL_DIR/VERSION (default .nccl/VERSION):
# libnccl.so.VERSION.gz as ../shared/nccl/README.md ships it (or .xz), or libnccl.so.2; it is unpacked under /tmp once.
set -euo pipefail
v=${1:?usage: tools/nccl_preload.sh VERSION COMMAND...}
shift
src=${NCCL_EXT_NCCL_DIR:-.nccl}/$v
dst=/tmp/nccl-$v/lib
if [ ! -e "$dst/libnccl.so.2" ]; then
  mkdir -p "$dst"
  if [ -e "$src/libnccl.so.$v.gz" ]; then
    gzip -dc "$src/libnccl.so.$v.gz" > "$dst/libnccl.so.$v"
  elif [ -e "$src/libnccl.so.$v.xz" ]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$src/libnccl.so.$v.xz" "$dst/libnccl.so.$v"
  elif [ -e "$src/libnccl.so.2" ]; then
    cp "$src/libnccl.so.2" "$dst/libnccl.so.$v"
  else
    echo "nccl_preload: no libnccl.so.$v.gz, .xz or libnccl.so.2 in $src" >&2
    exit 2
  fi
  ln -sf "libnccl.so.$v" "$dst/libnccl.so.2"
fi
export LD_PRELOAD=$dst/libnccl.so.2${LD_PRELOAD:+:$LD_PRELOAD}
exec "$@"
