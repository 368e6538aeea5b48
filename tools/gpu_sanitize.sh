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

# name | command (NRANKS, JSON substituted) | modes (real: 1 rank; nodes, virtual: 2 ranks on one GPU)
# The device-wait budgets are long (instrumented kernels, and the sanitizer's first patching of each kernel while a
# peer already waits, are slow); the tests of the timeout path itself keep a short one of their own.
# Small grids (--ctas 4): the one-GPU virtual ranks need every rank's CTAs resident at once, and under the sanitizer
# a 16-CTA smoke kernel was seen with one CTA never scheduled while its peers waited (both ranks timed out).
TESTS=(
  "symmem|$BUILDDIR/bin/symmetric_memory_test --test all --iters 3 --ctas 4 --slot-elems 65536 --rail-elems 4096 --timeout-s 3 --nranks NRANKS --json JSON|real nodes virtual"
  "symmem_dead_peer|$BUILDDIR/bin/symmetric_memory_test --test dead-peer --iters 6 --die-at 2 --ctas 4 --timeout-s 10 --slot-elems 65536 --rail-elems 4096 --nranks NRANKS --json JSON|nodes virtual"
  "ep_ht|$BUILDDIR/bin/ep_ht_test --quick --timeout-s 120 --silent-peer-s 5 --nranks NRANKS --json JSON|real nodes virtual"
  "m2n_exec|$BUILDDIR/bin/m2n_exec_test --cases 8 --nranks NRANKS --json JSON|real nodes"
  # Low-Latency; as one-GPU nodes across NVLink domains (the outboxes, the rail exchange, the inbox copy).
  "ep_ll|$BUILDDIR/bin/ep_ll_test --quick --timeout-s 120 --silent-peer-s 5 --nranks NRANKS --json JSON|real nodes"
  "ep_dead_peer|$BUILDDIR/bin/ep_dead_peer_test --iters 8 --die-at 3 --timeout-s 20 --nranks NRANKS --json JSON|virtual"
)
TOOLS=${GPU_SANITIZE_TOOLS:-memcheck racecheck synccheck}
RUN_TIMEOUT=${GPU_SANITIZE_RUN_TIMEOUT:-300}
: > "$RAW/runs.tsv"
for tool in $TOOLS; do
  for spec in "${TESTS[@]}"; do
    IFS='|' read -r name cmd modes <<<"$spec"
    # GPU_SANITIZE_ONLY=REGEX: only the tests whose name matches (a partial run; its JSON says which ran).
    [ -n "${GPU_SANITIZE_ONLY:-}" ] && ! [[ $name =~ $GPU_SANITIZE_ONLY ]] && continue
    for mode in $modes; do
      n=2
      [ "$mode" = real ] && n=1
      tag="$name[$tool]"
      [ "$mode" != real ] && tag="$name[$tool,$mode]"
      json="$RAW/$tag.$n.jsonl" log="$RAW/$tag.$n.log"
      : > "$json"
      c=${cmd//NRANKS/$n}
      c=${c//JSON/$json}
      [ "$mode" != real ] && c="$c --one-gpu $mode"
      # Out of time (a run may take up to GPU_SANITIZE_RUN_TIMEOUT): say so rather than stop silently.
      if [ $((SECONDS + RUN_TIMEOUT)) -gt "${GPU_SANITIZE_BUDGET_S:-1000000}" ]; then
        echo "== $tag: not run (GPU_SANITIZE_BUDGET_S spent)" | tee "$log"
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$n" 125 0 "$json" "$log" >> "$RAW/runs.tsv"
        continue
      fi
      echo "== $tag on $n rank(s)"
      start=$(date +%s.%N)
      timeout "$RUN_TIMEOUT" "$SAN" --tool "$tool" --target-processes all "${EXCLUDE[@]}" $c \
        >"$log" 2>&1
      rc=$?
      end=$(date +%s.%N)
      python3 tools/sanitize_filter.py tools/sanitize_suppressions.txt "$log" > "$log.filtered"
      frc=$?
      [ $rc -eq 0 ] && [ $frc -ne 0 ] && rc=99  # the test passed, but the sanitizer reported something of ours
      # Virtual ranks need every rank's kernels running at once; under compute-sanitizer kernels of different streams
      # of one process were seen not to (each rank waiting for a CTA of the other that never ran: docs/PERFORMANCE.md),
      # so a virtual run that fails only by a device wait's timeout, or is killed, with nothing of ours reported, is
      # inconclusive (98), not a pass.
      if [ "$mode" = virtual ] && [ $rc -ne 0 ] && [ $rc -ne 99 ] && [ $frc -eq 0 ] &&
         { [ $rc -eq 124 ] || grep -q "timed out after" "$log"; }; then
        rc=98
      fi
      cat "$log.filtered" >> "$log"
      grep -E "RACECHECK SUMMARY|PASS|FAIL" "$log" | sort | uniq -c | head -6
      tail -4 "$log.filtered"
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$n" "$rc" "$(awk "BEGIN{print $end - $start}")" "$json" "$log" >> "$RAW/runs.tsv"
      [ -n "${GPU_SANITIZE_KEEP_LOGS:-}" ] && [ $rc -ne 0 ] && cp "$log" "$GPU_SANITIZE_KEEP_LOGS/${tag//[^A-Za-z0-9_.-]/_}.log"
      # The report after every run: a session that ends early still leaves the runs it made.
      python3 tools/gpu_check_report.py --runs "$RAW/runs.tsv" --out "$OUTDIR/gpu-sanitize-$STAMP.json" \
        --kind gpu-sanitize >/dev/null
    done
  done
done
python3 tools/gpu_check_report.py --runs "$RAW/runs.tsv" --out "$OUTDIR/gpu-sanitize-$STAMP.json" --kind gpu-sanitize
