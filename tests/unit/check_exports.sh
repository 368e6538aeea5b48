#!/usr/bin/env bash
# usage: check_exports.sh LIB PREFIX [LIB PREFIX ...]
# Fails if a shared library exports a defined symbol that does not start with its prefix.
set -euo pipefail
status=0
while [ $# -ge 2 ]; do
  lib=$1 prefix=$2; shift 2
  bad=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -v "^${prefix}" || true)
  count=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -c "^${prefix}" || true)
  if [ -n "$bad" ]; then
    echo "FAIL $lib exports symbols without the prefix $prefix:"; echo "$bad" | head -20; status=1
  elif [ "$count" -eq 0 ]; then
    echo "FAIL $lib exports no $prefix symbol"; status=1
  else
    echo "ok $lib: $count symbols, all $prefix*"
  fi
done
exit $status
