#!/usr/bin/env bash
# `make gpu-sanitize`: every GPU suite under compute-sanitizer memcheck, racecheck, synccheck and initcheck, on 1 real
# rank and on 2 ranks on one GPU in both one-GPU modes (one-GPU nodes, virtual ranks), with results in
# bench/results/gpu-sanitize-<UTC time>.json (the gpu-check format, plus each row's "sanitize" verdict). A run passes
# when the test passes and the sanitizer reports nothing of ours. Reports from inside NCCL are not ours to fix:
# tools/sanitize_suppressions.txt names NCCL's kernels (not instrumented, but by initcheck) and NCCL's library (API
# errors its own host code raises and handles, dropped by tools/sanitize_filter.py from the innermost host frame or,
# in backtraces the tool shuffles, the NCCL function named); nothing of ours is ever filtered, and reports the tool
# did not print count as ours.
# The tests run with small shapes (--quick, fewer iterations) and a longer device-wait budget, since instrumented
# kernels run far slower. Assumes `make` has built $BUILDDIR.
#
# Every row (test, tool, mode) ends as one of: pass; fail; inconclusive (exit 98: a run with virtual ranks that
# fails only by a device wait's timeout, or is killed, with nothing of ours reported and no wrong result printed:
# compute-sanitizer stalls some of them); not run, with the reason (a row this machine cannot run, or the time
# budget spent).
# A row not run never counts as a pass. Exit status: 1 if any row failed, else 0.
#
# Options (environment):
#   GPU_SANITIZE_LIST=1          print the rows (number, name, ranks, command or why not run) and exit; needs no GPU
#   GPU_SANITIZE_TOOLS=...       the tools (default: memcheck racecheck synccheck initcheck)
#   GPU_SANITIZE_ONLY=REGEX      only the tests whose name matches
#   GPU_SANITIZE_MODES=...       only the rows of these modes (real nodes virtual mixed domains; default: all)
#   GPU_SANITIZE_PART=K/N        every N-th row of the selection from the K-th (1-based): N calls cover every row,
#                                each with its own JSON (tools/gpu_check_merge.py merges them)
#   GPU_SANITIZE_SKIP=JSON...    rows that pass or are inconclusive in these gpu-sanitize JSONs (committed ones: a
#                                later session's resume, when the raw rows are gone) are not run, nor in this call's
#                                JSON (tools/gpu_check_merge.py merges it with them); failed and not-run rows run again
#   GPU_SANITIZE_RESUME=DIR      rows run in DIR by earlier calls (pass, fail, inconclusive: DIR/done.tsv, one line a
#                                row; delete a line to run that row again) are not run again; this call's are added
#                                there, with their logs; the JSON covers every row of the selection. A row done
#                                earlier gets its verdict again from its log under the suppression list as it is now
#                                (a report a later entry attributes to NCCL no longer fails it; one of ours that no
#                                entry covers any more fails it), said on the console where it changes
#   GPU_SANITIZE_RUN_TIMEOUT=S   per run (default 300); GPU_SANITIZE_BUDGET_S=S: start no run that could end after S
#                                seconds of this call (those rows: not run, for a later call)
#   GPU_SANITIZE_VIRTUAL_TIMEOUT=S  per run of virtual ranks (default: the run timeout): a run the tool stalls (one
#                                rank's kernels held back) waits all of it, and killed it is inconclusive
#   GPU_SANITIZE_VIRTUAL_SMS=N   the EP tests' num_sms (--sms) in rows of virtual ranks (default 4): every rank's CTAs
#                                must be resident at once, and under the tool fewer are
#   GPU_SANITIZE_VIRTUAL_WAIT_S=S  the EP tests' device-wait budget in rows of virtual ranks (default 20; else 120)
#   GPU_SANITIZE_KEEP_LOGS=DIR   the whole log of every row that did not pass
#   GPU_SANITIZE_JOBS=N          rows of one rank or of one-GPU nodes run N at a time (default 1); a row of virtual
#                                ranks (virtual, mixed) runs alone, its ranks' kernels needing the GPU at once
#   GPU_SANITIZE_TAG=T           a suffix for the JSON's name
#   GPU_SANITIZE_TOOL_STALLS=V   an inconclusive row of virtual ranks whose tool stalled coschedule_probe in the same
#                                mode (this call's probe row, or one that GPU_SANITIZE_SKIP's JSONs settled) names that
#                                probe row in its "tool_stall" field; V=not-run makes such a row not run, with that
#                                reason (the tool does not run two streams' kernels of one process at once); default
#                                inconclusive: the verdict stays
#   GPU_SANITIZE_OURS_ONLY=REGEX the rows (test names) whose memcheck, racecheck and synccheck instrument only the
#                                libraries' kernels (mangled names holding ncclep, ncclm2n or ncclext), not the
#                                framework's (default '^python_': torch's, Triton's and XLA's kernels are not ours, and
#                                instrumenting them is most of those rows' time); initcheck instruments every kernel
#                                (a write by a kernel it does not instrument would look uninitialised to it)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILDDIR=${BUILDDIR:-build}
export NCCL_NVLS_ENABLE=0
OUTDIR=${GPU_CHECK_OUT:-bench/results}
LIST=${GPU_SANITIZE_LIST:-0}

NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$LIST" = 0 ] && [ "$NGPU" -eq 0 ]; then
  echo "gpu-sanitize: no GPU on this machine (nvidia-smi lists none): nothing to run."
  exit 0
fi
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if [ "$LIST" = 0 ] && [ ! -x "$SAN" ]; then
  echo "gpu-sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER)"
  exit 1
fi
PRINT_LIMIT=100000  # reports compute-sanitizer prints (its default, 100, leaves the rest unattributable)
OURS_ONLY=${GPU_SANITIZE_OURS_ONLY-^python_}
OURS=(--kernel-name kns=ncclep --kernel-name kns=ncclm2n --kernel-name kns=ncclext)  # additive filters
# NCCL's kernels, not instrumented by memcheck, racecheck and synccheck. initcheck instruments them: what a kernel it
# skips writes stays uninitialised to it (the result of ncclAllGatherHost's all-gather, read back by our copy, was
# reported so at 2 one-GPU nodes); its reports inside them count as ours (no entry of the list covers them).
EXCLUDE=()
while read -r kind pattern _; do
  [ "$kind" = kernel ] && EXCLUDE+=(--kernel-name-exclude "kns=$pattern")
done < tools/sanitize_suppressions.txt

# What the Python rows need: torch and pytest for python3 (torchrun for several ranks); the JAX row also
# libnccl_ep_jax.so and a JAX CUDA backend.
PY_MISSING=""
python3 -c "import torch, pytest" >/dev/null 2>&1 || PY_MISSING="no torch or no pytest for python3"
[ -z "$PY_MISSING" ] && ! command -v torchrun >/dev/null 2>&1 && PY_MISSING="no torchrun"
JAX_MISSING=$PY_MISSING
if [ -z "$JAX_MISSING" ] && ! { [ -f "$BUILDDIR/lib/libnccl_ep_jax.so" ] &&
     XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -c "import jax; jax.devices('gpu')" >/dev/null 2>&1; }; then
  JAX_MISSING="no $BUILDDIR/lib/libnccl_ep_jax.so or no JAX CUDA backend for python3"
fi

# name | command (NRANKS, JSON substituted) | modes
# Modes: real (1 rank, 1 GPU); domains (2 ranks on 2 real GPUs, each its own NVLink domain through
# NCCL_EXT_LSA_DOMAIN_SIZE=1 in the command); nodes, virtual (2 ranks on one GPU: one-GPU nodes, every rank a domain
# of its own so that every row between ranks crosses the rail; virtual ranks, one domain); mixed (4 ranks on one
# GPU: 2 one-GPU nodes of 2 virtual ranks, the relayed exchanges).
# The device-wait budgets are long (instrumented kernels, and the sanitizer's first patching of each kernel while a
# peer already waits, are slow); the tests of the timeout path itself keep a short one of their own.
# Small grids (--ctas 4; the EP tests' --sms in rows of virtual ranks): the one-GPU virtual ranks need every rank's
# CTAs resident at once, and under the sanitizer a 16-CTA smoke kernel was seen with one CTA never scheduled while its
# peers waited (both ranks timed out).
# Python (pytest under torchrun, which compute-sanitizer follows with --target-processes all; PyTorch's caching
# allocator off so that memcheck sees each tensor's bounds): the ranks' EP and M2N suites, the DeepEP drop-in and the
# JAX layer, 1 rank and 2 one-GPU nodes; conftest has no virtual ranks, so those rows are not run. The compile tests
# (Triton kernels generated at run time, not ours) are left out, and conftest skips the tests marked
# caching_allocator (CUDA graphs that allocate while capturing, the allocator's snapshot: they fail without it).
PYRUN="env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python PYTORCH_NO_CUDA_MEMORY_CACHING=1 torchrun --standalone --nproc_per_node NRANKS -m pytest -q -p no:cacheprovider"
# WAIT: the EP tests' device-wait budget, 120 s, and in rows of virtual ranks GPU_SANITIZE_VIRTUAL_WAIT_S (20: well
# inside the row's time limit, so that a stalled row says which wait of which rank timed out).
HT="$BUILDDIR/bin/ep_ht_test --quick --timeout-s WAIT --silent-peer-s 5 --nranks NRANKS --json JSON"
LL="$BUILDDIR/bin/ep_ll_test --quick --timeout-s WAIT --silent-peer-s 5 --nranks NRANKS --json JSON"
TESTS=(
  # No library code: whether the tool runs kernels of several streams of one process at once, as virtual ranks need
  # (tests/gpu/coschedule_probe.cu). Its rows are the evidence for, or against, blaming the tool for a stalled row of
  # virtual ranks.
  "coschedule_probe|$BUILDDIR/bin/coschedule_probe --ctas 4 --rounds 50 --wait-s 5 --nranks NRANKS --json JSON|virtual mixed"
  "symmem|$BUILDDIR/bin/symmetric_memory_test --test all --iters 3 --ctas 4 --slot-elems 65536 --rail-elems 4096 --timeout-s 3 --nranks NRANKS --json JSON|real nodes virtual"
  "symmem_dead_peer|$BUILDDIR/bin/symmetric_memory_test --test dead-peer --iters 6 --die-at 2 --ctas 4 --timeout-s 10 --slot-elems 65536 --rail-elems 4096 --nranks NRANKS --json JSON|nodes virtual"
  # High-Throughput and Low-Latency inside a domain (real, virtual) and across domains (nodes, domains: the flat
  # rail exchange; mixed: the relayed one).
  "ep_ht|$HT|real nodes virtual mixed"
  "ep_ll|$LL|real nodes virtual mixed"
  "ep_ht_domains|env NCCL_EXT_LSA_DOMAIN_SIZE=1 $HT|domains"
  "ep_ll_domains|env NCCL_EXT_LSA_DOMAIN_SIZE=1 $LL|domains"
  # The hierarchical High-Throughput exchange (one rail row per (token, destination domain), relayed there).
  "ep_ht_hier|env NCCL_EXT_HT_HIERARCHICAL=1 $HT|mixed"
  "ep_dead_peer|$BUILDDIR/bin/ep_dead_peer_test --iters 8 --die-at 3 --timeout-s 20 --nranks NRANKS --json JSON|nodes virtual"
  "ep_ll_dead_peer|$BUILDDIR/bin/ep_dead_peer_test --algo ll --iters 8 --die-at 3 --timeout-s 20 --nranks NRANKS --json JSON|nodes virtual"
  "m2n_exec|$BUILDDIR/bin/m2n_exec_test --cases 8 --nranks NRANKS --json JSON|real nodes virtual"
  "m2n_dead_peer|$BUILDDIR/bin/m2n_exec_test --dead-peer --timeout-s 10 --nranks NRANKS --json JSON|nodes virtual"
  "python_ep|$PYRUN -k not(compile) tests/python/test_ep_gpu.py tests/python/test_ep_ht_ranks.py tests/python/test_ep_ll_ranks.py --json JSON|real nodes virtual"
  "python_m2n|$PYRUN tests/python/test_m2n_gpu.py --json JSON|real nodes virtual"
  "python_deepep|$PYRUN -k not(compile) tests/python/test_deepep_gpu.py tests/python/test_deepep_ranks.py tests/python/test_deepep_elastic_gpu.py --json JSON|real nodes virtual"
  "python_ep_jax|$PYRUN tests/python/test_ep_jax_gpu.py --json JSON|real nodes virtual"
)
TOOLS=${GPU_SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
RUN_TIMEOUT=${GPU_SANITIZE_RUN_TIMEOUT:-300}
VIRTUAL_TIMEOUT=${GPU_SANITIZE_VIRTUAL_TIMEOUT:-$RUN_TIMEOUT}
VIRTUAL_SMS=${GPU_SANITIZE_VIRTUAL_SMS:-4}
VIRTUAL_WAIT=${GPU_SANITIZE_VIRTUAL_WAIT_S:-20}
JOBS=${GPU_SANITIZE_JOBS:-1}
TOOL_STALLS=${GPU_SANITIZE_TOOL_STALLS:-inconclusive}
[[ $TOOL_STALLS =~ ^(inconclusive|not-run)$ ]] ||
  { echo "gpu-sanitize: GPU_SANITIZE_TOOL_STALLS=$TOOL_STALLS: inconclusive or not-run" >&2; exit 2; }
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "gpu-sanitize: GPU_SANITIZE_JOBS=$JOBS: a positive integer" >&2; exit 2; }

PART_K=1 PART_N=1
if [ -n "${GPU_SANITIZE_PART:-}" ]; then
  if ! [[ $GPU_SANITIZE_PART =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 1 ] ||
     [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
    echo "gpu-sanitize: GPU_SANITIZE_PART=$GPU_SANITIZE_PART: K/N with 1 <= K <= N" >&2
    exit 2
  fi
  PART_K=${BASH_REMATCH[1]} PART_N=${BASH_REMATCH[2]}
fi
TAG=${GPU_SANITIZE_TAG:-}
[ "$PART_N" -gt 1 ] && TAG="part$PART_K-of-$PART_N${TAG:+-$TAG}"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)${TAG:+-$TAG}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# RAW: each row's JSON lines and log; done.tsv: the rows finished (kept across calls with GPU_SANITIZE_RESUME).
if [ -n "${GPU_SANITIZE_RESUME:-}" ]; then
  RAW=$GPU_SANITIZE_RESUME
  mkdir -p "$RAW" || exit 2
  RAW=$(cd "$RAW" && pwd)
else
  RAW=$TMP
fi
touch "$RAW/done.tsv" "$RAW/reasons.tsv"
# The rows GPU_SANITIZE_SKIP's JSONs settled (pass, inconclusive): "name<TAB>ranks", one a line.
: > "$TMP/skip.tsv"
[ -n "${GPU_SANITIZE_SKIP:-}" ] && { python3 - $GPU_SANITIZE_SKIP > "$TMP/skip.tsv" <<'EOF' || exit 2; }
import json, sys
for path in sys.argv[1:]:
    for r in json.load(open(path))["runs"]:
        if r.get("sanitize") in ("pass", "inconclusive"):
            print("%s\t%d" % (r["name"], r["nranks"]))
EOF
: > "$TMP/pending.tsv"
: > "$TMP/reasons.tsv"
[ "$LIST" = 0 ] && mkdir -p "$OUTDIR"

# why_not NAME MODE TOOL: why this machine, or the tool, cannot run the row (empty: it can).
why_not() {
  case $1 in
    python_ep_jax) [ -n "$JAX_MISSING" ] && { echo "$JAX_MISSING"; return; } ;;
    python_*) [ -n "$PY_MISSING" ] && { echo "$PY_MISSING"; return; } ;;
  esac
  case $1:$2 in
    python_*:virtual) echo "the Python tests have no virtual ranks (conftest: --one-gpu nodes only)"; return ;;
    python_*:mixed) echo "the Python tests have no virtual ranks (conftest: --one-gpu nodes only)"; return ;;
  esac
  # nccl.ep's tests (and its autograd, masking them after) compute on whole receive buffers, whose rows past the counts
  # nothing writes: torch's multiply kernels read them, 66,861 reports (a 497 MB log) before the second test ended, on
  # one H100, when the call's time ran out. The C rows take our kernels through initcheck.
  [ "$1:$3" = python_ep:initcheck ] &&
    echo "initcheck: torch's kernels read the receive buffers' rows past the counts, which the tests compute on" &&
    return
  [ "$2" = domains ] && [ "$NGPU" -lt 2 ] &&
    echo "needs 2 GPUs (NCCL_EXT_LSA_DOMAIN_SIZE=1 splits real GPUs into domains; this machine has $NGPU)"
}

report() {
  cat "$RAW/done.tsv" "$TMP/pending.tsv" > "$TMP/runs.tsv"
  cat "$RAW/reasons.tsv" "$TMP/reasons.tsv" > "$TMP/all_reasons.tsv"
  python3 tools/gpu_check_report.py --runs "$TMP/runs.tsv" --out "$OUTDIR/gpu-sanitize-$STAMP.json" \
    --kind gpu-sanitize >/dev/null
  # Each row's verdict: pass / fail / inconclusive / not-run (with the reason), and the selection this call made.
  python3 - "$OUTDIR/gpu-sanitize-$STAMP.json" "$TMP/all_reasons.tsv" "$TOOLS" "${GPU_SANITIZE_ONLY:-}" \
    "${GPU_SANITIZE_MODES:-}" "${GPU_SANITIZE_PART:-}" "${GPU_SANITIZE_RESUME:-}" "$1" "$TOOL_STALLS" \
    ${GPU_SANITIZE_SKIP:-} <<'EOF'
import json, os, re, sys
path, reasons_path, tools, only, modes, part, resume, final, tool_stalls = sys.argv[1:10]
reasons = {}
for line in open(reasons_path):
    tag, n, why = line.rstrip("\n").split("\t", 2)
    reasons[(tag, int(n))] = why
doc = json.load(open(path))
count = {"pass": 0, "fail": 0, "inconclusive": 0, "not-run": 0}
for r in doc["runs"]:
    why = reasons.get((r["name"], r["nranks"]))
    if why is not None:
        r["status"], r["sanitize"] = "not run: " + why, "not-run"
    elif r["status"] == "pass":
        r["sanitize"] = "pass"
    elif r["status"].startswith("inconclusive"):
        r["sanitize"] = "inconclusive"
    elif r["status"].startswith("skipped"):
        r["status"], r["sanitize"] = "not run: the test found no GPU", "not-run"
    else:
        r["sanitize"] = "fail"
# The probe rows (tool, mode) that stalled: this call's, then those GPU_SANITIZE_SKIP's JSONs settled.
stalled = {}
for source, runs in [("this call", doc["runs"])] + [(os.path.basename(p), json.load(open(p))["runs"])
                                                     for p in sys.argv[10:]]:
    for r in runs:
        m = re.fullmatch(r"coschedule_probe\[(\w+),(virtual|mixed)\]", r["name"])
        if m and r.get("sanitize") == "inconclusive":
            stalled.setdefault(m.groups(), "%s on %d ranks stalled (%s)" % (r["name"], r["nranks"], source))
for r in doc["runs"]:
    m = re.fullmatch(r"(.+)\[(\w+),(virtual|mixed)\]", r["name"])
    if m and m.group(1) != "coschedule_probe" and r["sanitize"] == "inconclusive" and m.group(2, 3) in stalled:
        r["tool_stall"] = stalled[m.group(2, 3)]
        if tool_stalls == "not-run":
            r["status"] = "not run: %s does not run two streams' kernels of one process at once: %s" % (
                m.group(2), r["tool_stall"])
            r["sanitize"] = "not-run"
    count[r["sanitize"]] += 1
doc["selection"] = {"tools": tools.split(), "only": only, "modes": modes.split(), "part": part, "resume": resume,
                    "tool_stalls": tool_stalls}
doc["summary"] = count
json.dump(doc, open(path, "w"), indent=1)
if final == "1":
    print("%-44s %6s %9s  %s" % ("row", "ranks", "seconds", "status"))
    for r in doc["runs"]:
        print("%-44s %6d %9.1f  %s" % (r["name"], r["nranks"], r["seconds"], r["status"][:110]))
        if r["sanitize"] in ("fail", "inconclusive") and r.get("log_tail"):
            print("    " + r["log_tail"].replace("\n", "\n    "))
    print("\n%(pass)d passed, %(fail)d failed, %(inconclusive)d inconclusive, %(not-run)d not run" % count)
    print("results: %s" % path)
sys.exit(1 if count["fail"] else 0)
EOF
}

# virtual_ranks MODE: whether the row's ranks are virtual ranks of one process (virtual, mixed): their kernels need
# the GPU at once, so such a row runs alone, and a timeout there may be the tool's, not ours.
virtual_ranks() { [ "$1" = virtual ] || [ "$1" = mixed ]; }

# run_timeout MODE: the row's time limit (GPU_SANITIZE_VIRTUAL_TIMEOUT for virtual ranks).
run_timeout() { if virtual_ranks "$1"; then echo "$VIRTUAL_TIMEOUT"; else echo "$RUN_TIMEOUT"; fi; }

# not_run TAG N CODE WHY JSON LOG: the row is not run by this call (97: this machine cannot; 125: the time budget),
# with the reason; it stays out of done.tsv, so a later call asks again.
not_run() {
  echo "== $1 on $2 rank(s): not run: $4"
  printf '%s\t%s\t%s\n' "$1" "$2" "$4" >> "$TMP/reasons.tsv"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" 0 "$5" "$6" >> "$TMP/pending.tsv"
}

# filter_log LOG: the sanitizer's reports in LOG that are ours, into LOG.filtered (tools/sanitize_filter.py); non-zero
# when there are any.
filter_log() { python3 tools/sanitize_filter.py tools/sanitize_suppressions.txt "$1" > "$1.filtered"; }

# wrong_result LOG: whether the test printed a wrong result or a broken promise (a value that differs from the host
# reference, an error that should have been reported and was not) before it ended; the libraries' own lines ([nccl_ep],
# [nccl_m2n]: the negative tests' expected errors) are not read.
WRONG_RESULT='differs|wrong value| wrong$|got [-+0-9a-fx.e]+ want|conversions disagree|no ncclRemoteError'
WRONG_RESULT="$WRONG_RESULT|an error though no token|does not name the late rank|not cleared once returned"
WRONG_RESULT="$WRONG_RESULT|is not masked"
wrong_result() { grep -v '^\[nccl' "$1" | grep -qE "$WRONG_RESULT"; }

# verdict TRC FRC MODE LOG: a row's exit status from its test's (TRC) and the filter's (FRC, non-zero: a report of
# ours). A test that passed with a report of ours fails (99). Virtual ranks need every rank's kernels running at once;
# under compute-sanitizer kernels of different streams of one process were seen not to (each rank waiting for a CTA of
# the other that never ran: docs/PERFORMANCE.md; the coschedule_probe rows ask the tool with no library code), so a run
# with virtual ranks that fails only by a device wait's timeout, or is killed, with nothing of ours reported and no
# wrong result printed, is inconclusive (98), not a pass. A wrong result is not the stall's to excuse: under any delay
# the libraries promise an error, not other values.
verdict() {
  local trc=$1 frc=$2 mode=$3 log=$4
  if [ "$trc" -eq 0 ]; then
    if [ "$frc" -ne 0 ]; then echo 99; else echo 0; fi
  elif virtual_ranks "$mode" && [ "$frc" -eq 0 ] && ! wrong_result "$log" &&
    { [ "$trc" -eq 124 ] || grep -q "timed out after" "$log"; }; then
    echo 98
  else
    echo "$trc"
  fi
}

# reverdict: every row of done.tsv whose log is in RAW gets its verdict again under the suppression list as it is
# now, from the test's exit status that run_row wrote into the log (logs without that line: 0 for a 99, 124 for a 98,
# else the row's status); its files are named in RAW (a folder carried from another machine still resolves).
reverdict() {
  local tag n rc secs json log trc frc mode new
  : > "$TMP/redone.tsv"
  while IFS=$'\t' read -r tag n rc secs json log; do
    [ -f "$RAW/$tag.$n.jsonl" ] && json="$RAW/$tag.$n.jsonl"
    [ -f "$RAW/$tag.$n.log" ] && log="$RAW/$tag.$n.log"
    new=$rc
    if [ -f "$log" ]; then
      trc=$(sed -n "s/^gpu-sanitize: the test's exit status: \([0-9]*\)$/\1/p" "$log" | tail -1)
      [ -z "$trc" ] && case $rc in 99) trc=0 ;; 98) trc=124 ;; *) trc=$rc ;; esac
      filter_log "$log"
      frc=$?
      case $tag in *,virtual\]) mode=virtual ;; *,mixed\]) mode=mixed ;; *) mode=other ;; esac
      new=$(verdict "$trc" "$frc" "$mode" "$log")
      if [ "$new" != "$rc" ]; then
        echo "== $tag on $n rank(s): done in an earlier call; under the suppression list as it is now, exit $rc -> $new"
        { echo "gpu-sanitize: the verdict again, under the suppression list as it is now:"; cat "$log.filtered"; } \
          >> "$log"
      fi
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$n" "$new" "$secs" "$json" "$log" >> "$TMP/redone.tsv"
  done < "$RAW/done.tsv"
  cat "$TMP/redone.tsv" > "$RAW/done.tsv"
}

# filters TOOL TAG: the row's kernel filters, one word a line: NCCL's kernels left out, and the libraries' kernels
# only (GPU_SANITIZE_OURS_ONLY); initcheck gets neither.
filters() {
  [ "$1" = initcheck ] && return 0
  [ ${#EXCLUDE[@]} -gt 0 ] && printf '%s\n' "${EXCLUDE[@]}"
  [ -n "$OURS_ONLY" ] && [[ ${2%%\[*} =~ $OURS_ONLY ]] && printf '%s\n' "${OURS[@]}"
  return 0
}

# run_row TOOL TAG N MODE JSON LOG COMMAND: one row under the sanitizer; its line goes to done.tsv (one short write,
# so that rows running at once do not interleave it).
run_row() {
  local tool=$1 tag=$2 n=$3 mode=$4 json=$5 log=$6 c=$7 start end rc frc kf
  mapfile -t kf < <(filters "$tool" "$tag")
  : > "$json"
  echo "== $tag on $n rank(s)"
  start=$(date +%s.%N)
  set -f  # the command's words are not globbed (a row's file names hold brackets)
  timeout "$(run_timeout "$mode")" "$SAN" --tool "$tool" --target-processes all --print-limit "$PRINT_LIMIT" \
    ${kf[@]+"${kf[@]}"} $c >"$log" 2>&1
  rc=$?
  set +f
  end=$(date +%s.%N)
  filter_log "$log"
  frc=$?
  echo "gpu-sanitize: the test's exit status: $rc" >> "$log"
  rc=$(verdict "$rc" "$frc" "$mode" "$log")
  cat "$log.filtered" >> "$log"
  grep -E "RACECHECK SUMMARY|PASS|FAIL" "$log" | sort | uniq -c | head -6
  tail -4 "$log.filtered"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$n" "$rc" "$(awk "BEGIN{print $end - $start}")" "$json" "$log" \
    >> "$RAW/done.tsv"
  [ -n "${GPU_SANITIZE_KEEP_LOGS:-}" ] && [ $rc -ne 0 ] &&
    cp "$log" "$GPU_SANITIZE_KEEP_LOGS/${tag//[^A-Za-z0-9_.-]/_}.$n.log"
  return 0
}

# start_row TOOL TAG N MODE JSON LOG COMMAND: not run when the time budget is spent (a run may take up to its
# run_timeout: left for a later call); else run now (one job), or in the background beside at most
# JOBS - 1 others (a row of virtual ranks alone); the report is rewritten after every run, so that a session that
# ends early still leaves the runs it made.
start_row() {
  local tool=$1 tag=$2 n=$3 mode=$4 json=$5 log=$6 c=$7 max=$JOBS
  if [ $((SECONDS + $(run_timeout "$mode"))) -gt "${GPU_SANITIZE_BUDGET_S:-1000000}" ]; then
    not_run "$tag" "$n" 125 "time budget spent (GPU_SANITIZE_BUDGET_S): a later call" "$json" "$log"
    return
  fi
  if [ "$JOBS" -le 1 ]; then
    run_row "$tool" "$tag" "$n" "$mode" "$json" "$log" "$c"
    report 0 >/dev/null
    return
  fi
  virtual_ranks "$mode" && max=1
  while [ "$(jobs -rp | wc -l)" -ge "$max" ]; do
    wait -n
    report 0 >/dev/null
  done
  { run_row "$tool" "$tag" "$n" "$mode" "$json" "$log" "$c" > "$log.out" 2>&1; cat "$log.out"; } &
  if [ "$max" = 1 ]; then
    wait
    report 0 >/dev/null
  fi
}

[ "$LIST" = 0 ] && [ -n "${GPU_SANITIZE_RESUME:-}" ] && reverdict
SELECTED=0 DEFERRED=()
for tool in $TOOLS; do
  for spec in "${TESTS[@]}"; do
    IFS='|' read -r name cmd modes <<<"$spec"
    [ -n "${GPU_SANITIZE_ONLY:-}" ] && ! [[ $name =~ $GPU_SANITIZE_ONLY ]] && continue
    for mode in $modes; do
      [ -n "${GPU_SANITIZE_MODES:-}" ] && [[ " $GPU_SANITIZE_MODES " != *" $mode "* ]] && continue
      case $mode in real) n=1 ;; mixed) n=4 ;; *) n=2 ;; esac
      tag="$name[$tool]"
      case $mode in real | domains) ;; *) tag="$name[$tool,$mode]" ;; esac
      SELECTED=$((SELECTED + 1))
      [ $(((SELECTED - 1) % PART_N)) -ne $((PART_K - 1)) ] && continue
      json="$RAW/$tag.$n.jsonl" log="$RAW/$tag.$n.log"
      c=${cmd//NRANKS/$n}
      if virtual_ranks "$mode"; then c=${c//WAIT/$VIRTUAL_WAIT}; else c=${c//WAIT/120}; fi
      c=${c//JSON/$json}
      case $mode in nodes | virtual | mixed) c="$c --one-gpu $mode" ;; esac
      [[ $name == ep_* ]] && virtual_ranks "$mode" && c="$c --sms $VIRTUAL_SMS"
      why=$(why_not "$name" "$mode" "$tool")
      if [ "$LIST" != 0 ]; then
        printf '%3d  %-40s %d rank(s)  %s\n' "$SELECTED" "$tag" "$n" "${why:+not run: $why}"
        f=$(filters "$tool" "$tag" | paste -sd' ')
        [ -z "$why" ] &&
          printf '     %s --tool %s --print-limit %s %s%s\n' "$(basename "$SAN")" "$tool" "$PRINT_LIMIT" \
            "${f:+$f }" "$c"
        continue
      fi
      if grep -qxF -- "$tag	$n" "$TMP/skip.tsv"; then
        echo "== $tag on $n rank(s): settled in GPU_SANITIZE_SKIP's JSON"
        continue
      fi
      if grep -qF -- "$tag	$n	" "$RAW/done.tsv"; then
        echo "== $tag on $n rank(s): done in an earlier call (GPU_SANITIZE_RESUME)"
        continue
      fi
      if [ -n "$why" ]; then
        not_run "$tag" "$n" 97 "$why" "$json" "$log"  # (a resumed check on another machine may run it)
        continue
      fi
      # With several jobs, the rows of virtual ranks (each alone) come after the others.
      if [ "$JOBS" -gt 1 ] && virtual_ranks "$mode"; then
        DEFERRED+=("$tool	$tag	$n	$mode	$json	$log	$c")
        continue
      fi
      start_row "$tool" "$tag" "$n" "$mode" "$json" "$log" "$c"
    done
  done
done
wait
for d in ${DEFERRED[@]+"${DEFERRED[@]}"}; do
  IFS=$'\t' read -r tool tag n mode json log c <<<"$d"
  start_row "$tool" "$tag" "$n" "$mode" "$json" "$log" "$c"
done
wait
if [ "$LIST" != 0 ]; then
  echo "$SELECTED rows selected${GPU_SANITIZE_PART:+, part $GPU_SANITIZE_PART: every $PART_N-th from row $PART_K}"
  exit 0
fi
report 1
