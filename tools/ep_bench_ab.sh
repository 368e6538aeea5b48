#!/usr/bin/env bash
# An A/B of ep_bench between this tree and older trees, in one call on the GPU machine (which has no git history:
# bring each older tree as a `git archive` tarball).
#
#   here:            git archive REV -o .dev/REV.tar       (.dev/ in .git/info/exclude; carry it to the GPU machine)
#   GPU machine:     tools/ep_bench_ab.sh [--runs N] [--out DIR] OLD.tar... -- ARGS [-- ARGS ...]
#
# Builds this tree (make all, unless build/bin/ep_bench exists) and, in parallel, each OLD.tar's ep_bench and
# ep_ll_bench (its own make configure; CUDA_ARCHS, default 90). Then N rounds (default 3): in each, every ARGS set
# (e.g. `--mode ll --nranks 1`, `--mode ht --quick --nranks 1`) runs once per build, this tree first, so that the
# builds alternate within a round. JSON lines go to DIR (default $OUT, else /tmp/ep_bench_ab)/ab-new.jsonl and
# ab-<tar name>.jsonl, each run's text beside them, and tools/ep_bench_ab.py's summary of new against each old build
# to ab-<tar name>-summary.txt (its first lines printed). Every ep_bench runs under `timeout` (EP_BENCH_AB_TIMEOUT,
# default 90 s). Exit status: 1 when a build or a run failed, or an A/B found a missing or failed row.
set -uo pipefail
cd "$(dirname "$0")/.."

runs=3
out=${OUT:-/tmp/ep_bench_ab}
olds=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) olds+=("$1"); shift ;;
  esac
done
argsets=()
while [ $# -gt 0 ]; do
  shift  # the --
  set_=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do set_+=("$1"); shift; done
  [ ${#set_[@]} -gt 0 ] && argsets+=("${set_[*]}")
done
if [ ${#argsets[@]} -eq 0 ]; then
  echo "ep_bench_ab.sh: no ARGS set (e.g. -- --mode ll --nranks 1 -- --mode ht --quick --nranks 1)" >&2
  exit 2
fi
export NCCL_NVLS_ENABLE=0
archs=${CUDA_ARCHS:-90}
tmo=${EP_BENCH_AB_TIMEOUT:-90}
mkdir -p "$out"
status=0

# Builds: this tree and every old one at once (16 cores: the old trees build two targets each).
declare -A dirs
[ -x build/bin/ep_bench ] || (make all -j16 JOBS=16 CUDA_ARCHS="$archs" > "$out/build-new.log" 2>&1; echo $? > "$out/build-new.rc") &
for t in "${olds[@]}"; do
  name=$(basename "$t" .tar)
  d=/tmp/ep_bench_ab-$name
  dirs[$name]=$d
  (rm -rf "$d" && mkdir -p "$d" && tar -xf "$t" -C "$d" && cd "$d" && make configure CUDA_ARCHS="$archs" > "$out/build-$name.log" 2>&1 &&
     cmake --build build -j8 --target ep_bench ep_ll_bench >> "$out/build-$name.log" 2>&1; echo $? > "$out/build-$name.rc") &
done
wait
for f in "$out"/build-*.rc; do
  [ -f "$f" ] || continue
  if [ "$(cat "$f")" != 0 ]; then
    echo "ep_bench_ab.sh: $(basename "$f" .rc) failed:"; tail -20 "${f%.rc}.log"; status=1
  fi
done
[ $status = 0 ] || exit 1

run() {  # run NAME BIN ARGS...
  local name=$1 bin=$2; shift 2
  if ! timeout "$tmo" "$bin" "$@" --json "$out/ab-$name.jsonl" >> "$out/ab-$name.txt" 2>&1; then
    echo "ep_bench_ab.sh: $name: ep_bench $* failed (see $out/ab-$name.txt)"; status=1
  fi
}
for r in $(seq 1 "$runs"); do
  for a in "${argsets[@]}"; do
    read -r -a av <<< "$a"
    run new build/bin/ep_bench "${av[@]}"
    for name in "${!dirs[@]}"; do run "$name" "${dirs[$name]}/build/bin/ep_bench" "${av[@]}"; done
  done
  echo "ep_bench_ab.sh: round $r of $runs done"
done
for name in "${!dirs[@]}"; do
  python3 tools/ep_bench_ab.py --new "$out/ab-new.jsonl" --old "$out/ab-$name.jsonl" > "$out/ab-$name-summary.txt" 2>&1 ||
    status=1
  echo "== new against $name"; grep " rows " "$out/ab-$name-summary.txt"
done
exit $status
