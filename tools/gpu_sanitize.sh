#!/usr/bin/env bash
# `make gpu-sanitize`: every GPU test under compute-sanitizer memcheck, racecheck and synccheck, on 1 real rank and
# on 2 ranks on one GPU in both one-GPU modes (one-GPU nodes, virtual ranks), with results in
# bench/results/gpu-sanitize-<UTC time>.json (the gpu-check format). A run passes when the test passes and the
# sanitizer reports nothing of ours. Reports from inside NCCL are not ours to fix: tools/sanitize_suppressions.txt names
# NCCL's kernels (not instrumented) and NCCL's library (API errors its own host code raises and handles, dropped by
# tools/sanitize_filter.py from the innermost host frame); nothing of ours is ever filtered.
# The tests run with small shapes (--quick, fewer iterations) and a longer device-wait budget, since instrumented
# kernels run far slower. Assumes `make` has built $BUILDDIR.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILDDIR=${BUILDDIR:-build}
export NCCL_NVLS_ENABLE=0
OUTDIR=${GPU_CHECK_OUT:-bench/results}
mkdir -p "$OUTDIR"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-sanitize: no GPU on this machine (nvidia-smi lists none): nothing to run."
  exit 0
fi
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if [ ! -x "$SAN" ]; then
  echo "gpu-sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER)"
  exit 1
fi
EXCLUDE=()
while read -r kind pattern _; do
  [ "$kind" = kernel ] && EXCLUDE+=(--kernel-name-exclude "kns=$pattern")
done < tools/sanitize_suppressions.txt

# name | command (NRANKS, JSON substituted)
TESTS=(
  "symmem_smoke|$BUILDDIR/bin/symmetric_memory_test --test smoke --iters 3 --slot-elems 65536 --rail-elems 4096 --nranks NRANKS --json JSON"
  "symmem_timeout|$BUILDDIR/bin/symmetric_memory_test --test timeout --timeout-s 3 --nranks NRANKS --json JSON"
  "ep_ht|$BUILDDIR/bin/ep_ht_test --quick --timeout-s 20 --nranks NRANKS --json JSON"
)
TOOLS=${GPU_SANITIZE_TOOLS:-memcheck racecheck synccheck}
: > "$RAW/runs.tsv"
for tool in $TOOLS; do
  for spec in "${TESTS[@]}"; do
    IFS='|' read -r name cmd <<<"$spec"
    for mode in real nodes virtual; do
      n=2
      [ "$mode" = real ] && n=1
      tag="$name[$tool]"
      [ "$mode" != real ] && tag="$name[$tool,$mode]"
      json="$RAW/$tag.$n.jsonl" log="$RAW/$tag.$n.log"
      : > "$json"
      c=${cmd//NRANKS/$n}
      c=${c//JSON/$json}
      [ "$mode" != real ] && c="$c --one-gpu $mode"
      if [ "$SECONDS" -gt "${GPU_SANITIZE_BUDGET_S:-1000000}" ]; then  # out of time: say so rather than stop silently
        echo "== $tag: not run (GPU_SANITIZE_BUDGET_S spent)" | tee "$log"
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$n" 125 0 "$json" "$log" >> "$RAW/runs.tsv"
        continue
      fi
      echo "== $tag on $n rank(s)"
      start=$(date +%s.%N)
      timeout "${GPU_SANITIZE_RUN_TIMEOUT:-300}" "$SAN" --tool "$tool" --target-processes all "${EXCLUDE[@]}" $c \
        >"$log" 2>&1
      rc=$?
      end=$(date +%s.%N)
      python3 tools/sanitize_filter.py tools/sanitize_suppressions.txt "$log" > "$log.filtered"
      frc=$?
      [ $rc -eq 0 ] && [ $frc -ne 0 ] && rc=99  # the test passed, but the sanitizer reported something of ours
      cat "$log.filtered" >> "$log"
      grep -E "RACECHECK SUMMARY|PASS|FAIL" "$log" | sort | uniq -c | head -6
      tail -4 "$log.filtered"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$n" "$rc" "$(awk "BEGIN{print $end - $start}")" "$json" "$log" >> "$RAW/runs.tsv"
      [ -n "${GPU_SANITIZE_KEEP_LOGS:-}" ] && [ $rc -ne 0 ] && cp "$log" "$GPU_SANITIZE_KEEP_LOGS/${tag//[^A-Za-z0-9_.-]/_}.log"
    done
  done
done
python3 tools/gpu_check_report.py --runs "$RAW/runs.tsv" --out "$OUTDIR/gpu-sanitize-$STAMP.json" --kind gpu-sanitize
