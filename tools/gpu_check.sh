#!/usr/bin/env bash
# Runs every GPU test (and, as they exist, the benchmarks) on the local GPUs, for every rank count from 1 to the
# number of GPUs, then at 2 and 4 ranks (GPU_CHECK_ONE_GPU_RANKS) where the machine has fewer GPUs than that, in
# both one-GPU modes (one-GPU nodes, virtual ranks; tests/README.md), prints a summary table and writes
# bench/results/gpu-check-<UTC time>.json (GPU model, driver, NCCL versions, git commit, date, one row per run).
# Assumes `make` has built $BUILDDIR.
# Exit status: 0 if every run passed (or there is no GPU: then it says so and runs nothing), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILDDIR=${BUILDDIR:-build}
export NCCL_NVLS_ENABLE=0   # NVLink multicast is forbidden on our machines
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # a failed run's log then says which NCCL call failed and why (the syscall)
OUTDIR=${GPU_CHECK_OUT:-bench/results}
mkdir -p "$OUTDIR"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)${GPU_CHECK_TAG:+-$GPU_CHECK_TAG}  # GPU_CHECK_TAG: a suffix for the JSON's name
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
report() {
  BUILDDIR=$BUILDDIR python3 tools/gpu_check_report.py --runs "$RAW/runs.tsv" --out "$OUTDIR/gpu-check-$STAMP.json"
}
# Stopped (an outer timeout, ^C): the running row is stopped too (its `timeout` passes the signal on, then SIGKILL
# 10 s later), and the report still gets written, with the rows run so far and that one (exit 143, its log so far),
# so that a stopped check loses no verdict.
CURRENT="" CHILD=""  # the running row (tag, ranks, start, JSON lines, log; tab separated) and its `timeout`
stopped() {
  trap '' TERM INT  # an outer `timeout` signals the check, then its process group: the second must not cut this short
  if [ -n "$CURRENT" ]; then
    kill -TERM "$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
    IFS=$'\t' read -r tag n start json log <<<"$CURRENT"
    printf '%s\t%s\t143\t%s\t%s\t%s\n' "$tag" "$n" "$(awk "BEGIN{print $(date +%s.%N) - $start}")" "$json" "$log" \
      >> "$RAW/runs.tsv"
  fi
  echo "gpu-check: stopped by a signal; reporting the rows run so far" >&2
  report
  exit 143
}
trap stopped TERM INT

NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$NGPU" -eq 0 ]; then
  echo "gpu-check: no GPU on this machine (nvidia-smi lists none): nothing to run."
  exit 0
fi
MAXR=${GPU_CHECK_MAX_RANKS:-$NGPU}

# name | command (NRANKS and JSON are substituted) | minimum ranks | one-GPU modes it runs in (MODE:MAX: at most MAX
# ranks in that mode; MODE+MIN: at least MIN)
RUNS=(
  # mixed (symmetric_memory_test, ep_ht_test, ep_ll_test): one-GPU nodes of 2 virtual ranks each (launcher.h):
  # at 4 ranks two domains of two, LSA inside them and the rail between them at once (EP: the relayed exchange).
  # No library code: kernels of several streams of one process run at once (the one-GPU virtual ranks rely on it;
  # make gpu-sanitize asks the same of each compute-sanitizer tool).
  "coschedule_probe|$BUILDDIR/bin/coschedule_probe --nranks NRANKS --json JSON|2|virtual mixed+4"
  "symmem_smoke|$BUILDDIR/bin/symmetric_memory_test --test smoke --nranks NRANKS --json JSON|1|nodes virtual mixed+4"
  "symmem_timeout|$BUILDDIR/bin/symmetric_memory_test --test timeout --timeout-s 2 --nranks NRANKS --json JSON|1|nodes virtual mixed+4"
  "ep_ht|$BUILDDIR/bin/ep_ht_test --nranks NRANKS --json JSON|1|nodes virtual mixed+4"
  "ep_ll|$BUILDDIR/bin/ep_ll_test --nranks NRANKS --json JSON|1|nodes virtual mixed+4"
  # ... on every SM (num_sms above the default 64: cooperative launches, nccl_ep/src/ll/calls.cc).
  "ep_ll_all_sms|$BUILDDIR/bin/ep_ll_test --sms 1024 --nranks NRANKS --json JSON|1|nodes"
  # The soaks (tests/harness/soak.h): 10,000 checked pairs with handle churn, memory flat; one-GPU nodes have the
  # Python soak (python_soak), whose pairs cost milliseconds over the sockets.
  "ep_ht_soak|$BUILDDIR/bin/ep_ht_test --soak 10000 --nranks NRANKS --json JSON|1|virtual"
  "ep_ll_soak|$BUILDDIR/bin/ep_ll_test --soak 10000 --nranks NRANKS --json JSON|1|virtual"
  # The same HT suite with the hierarchical dispatch (experimental: one rail row per (token, destination domain)); at 4
  # mixed ranks also --silent-relay (a relay whose reduce failed: its partials refused, the relay named).
  "ep_ht_hier|env NCCL_EXT_HT_HIERARCHICAL=1 $BUILDDIR/bin/ep_ht_test --silent-relay --nranks NRANKS --json JSON|1|mixed+4"
  # ... and in rounds of 96 rail positions a domain (512-token calls: up to six rounds, the last one partial).
  "ep_ht_hier_rounds|env NCCL_EXT_HT_HIERARCHICAL=1 NCCL_EXT_RAIL_ROUND_TOKENS=96 $BUILDDIR/bin/ep_ht_test --nranks NRANKS --json JSON|1|mixed+4"
  # ... and with its send half (NVLink only) on a stream of its own beside the rounds (NCCL_EXT_RAIL_OVERLAP=1).
  "ep_ht_hier_overlap|env NCCL_EXT_HT_HIERARCHICAL=1 NCCL_EXT_RAIL_OVERLAP=1 NCCL_EXT_RAIL_ROUND_TOKENS=96 $BUILDDIR/bin/ep_ht_test --nranks NRANKS --json JSON|2|mixed+4"
  # The same HT suite across one-GPU nodes with the flat exchange in rounds of 96 slots a peer (512-token calls:
  # up to six rounds, the last one partial; the default round, 1024, makes every call of the suite one round).
  "ep_ht_rounds|env NCCL_EXT_RAIL_ROUND_TOKENS=96 $BUILDDIR/bin/ep_ht_test --nranks NRANKS --json JSON|2|nodes"
  # ... and with the NVLink rows on a stream of their own beside the rail rounds (NCCL_EXT_RAIL_OVERLAP=1, opt-in).
  "ep_ht_overlap|env NCCL_EXT_RAIL_OVERLAP=1 $BUILDDIR/bin/ep_ht_test --nranks NRANKS --json JSON|2|nodes"
  # Real GPUs split into NVLink domains (2+ GPUs: domains of one, the flat rail exchange between them; 4+ GPUs:
  # domains of two with the hierarchical HT over the Domain's rail, tests/harness/silent_peer.h's relayed verdict).
  "ep_ht_domains|env NCCL_EXT_LSA_DOMAIN_SIZE=1 $BUILDDIR/bin/ep_ht_test --nranks NRANKS --json JSON|2|"
  "ep_ll_domains|env NCCL_EXT_LSA_DOMAIN_SIZE=1 $BUILDDIR/bin/ep_ll_test --nranks NRANKS --json JSON|2|"
  "ep_ht_hier_domains|env NCCL_EXT_HT_HIERARCHICAL=1 NCCL_EXT_LSA_DOMAIN_SIZE=2 $BUILDDIR/bin/ep_ht_test --nranks NRANKS --json JSON|4|"
  "symmem_dead_peer|$BUILDDIR/bin/symmetric_memory_test --test dead-peer --iters 10 --die-at 3 --timeout-s 3 --slot-elems 65536 --nranks NRANKS --json JSON|2|nodes virtual"
  "ep_dead_peer|$BUILDDIR/bin/ep_dead_peer_test --nranks NRANKS --json JSON|2|nodes virtual"
  "ep_ll_dead_peer|$BUILDDIR/bin/ep_dead_peer_test --algo ll --nranks NRANKS --json JSON|2|nodes virtual"
  # The Low-Latency benchmark (a run: rows with the empty-kernel floor of the same run; docs/PERFORMANCE.md). As
  # one-GPU nodes, across domains: beside NCCL send/recv of the rail exchange's bytes in the same run.
  "ep_ll_bench|$BUILDDIR/bin/ep_bench --mode ll --nranks NRANKS --json JSON|1|nodes virtual"
  # The High-Throughput benchmark across domains (one-GPU nodes: beside NCCL send/recv of the rail exchange's bytes
  # in the same run; --quick keeps real-GPU runs to one shape, the full benchmark being bench/run_ep_bench.sh's).
  # mixed: over relayed exchanges, beside NCCL send/recv of the exchange's own messages on the rail; _hier: the
  # hierarchical HT (one rail row per (token, destination domain)).
  "ep_ht_bench|$BUILDDIR/bin/ep_bench --mode ht --quick --nranks NRANKS --json JSON|2|nodes virtual mixed+4"
  # Issue 41 at 2 ranks, inside one domain (virtual) and across two (nodes: the per-peer inboxes and their scatter):
  # the group with a receive cap of every row (8192 = 2 x 4096, nothing dropped: dense staging), then its dispatch
  # into the window (zero-copy: no receiver copy of a peer's rows).
  "ep_ht_bench_cap|$BUILDDIR/bin/ep_bench --mode ht --quick --recv-cap 8192 --nranks NRANKS --json JSON|2|virtual:2 nodes:2"
  "ep_ht_bench_zero_copy|$BUILDDIR/bin/ep_bench --mode ht --quick --recv-cap 8192 --zero-copy --nranks NRANKS --json JSON|2|virtual:2 nodes:2"
  "ep_ht_bench_hier|env NCCL_EXT_HT_HIERARCHICAL=1 $BUILDDIR/bin/ep_bench --mode ht --quick --nranks NRANKS --json JSON|2|mixed+4"
  # The flat exchange in rounds of 128 slots (512-token calls: four rounds), beside ep_ht_bench's one round; with
  # its NVLink rows beside the rail (NCCL_EXT_RAIL_OVERLAP=1, A/B against ep_ht_bench); the hierarchical one in
  # rounds of 128 rail positions a domain, and with its send half beside the rail (A/B against ep_ht_bench_hier).
  "ep_ht_bench_rounds|env NCCL_EXT_RAIL_ROUND_TOKENS=128 $BUILDDIR/bin/ep_bench --mode ht --quick --nranks NRANKS --json JSON|2|nodes"
  "ep_ht_bench_overlap|env NCCL_EXT_RAIL_OVERLAP=1 $BUILDDIR/bin/ep_bench --mode ht --quick --nranks NRANKS --json JSON|2|nodes"
  "ep_ht_bench_hier_rounds|env NCCL_EXT_HT_HIERARCHICAL=1 NCCL_EXT_RAIL_ROUND_TOKENS=128 $BUILDDIR/bin/ep_bench --mode ht --quick --nranks NRANKS --json JSON|2|mixed+4"
  "ep_ht_bench_hier_overlap|env NCCL_EXT_HT_HIERARCHICAL=1 NCCL_EXT_RAIL_OVERLAP=1 $BUILDDIR/bin/ep_bench --mode ht --quick --nranks NRANKS --json JSON|2|mixed+4"
  # nodes: every piece between ranks by ncclSend/ncclRecv (100 batches: loopback sockets are slow); real GPUs and
  # virtual ranks, every piece over LSA through the plans' windows: 1000 batches, about 2000 layout pairs (the
  # virtual ranks' 4-rank failures of earlier sessions were cured by their launch fences: docs/M2N.md).
  "m2n_exec|$BUILDDIR/bin/m2n_exec_test --nranks NRANKS --cases 100 --json JSON|2|nodes"
  "m2n_exec_many|$BUILDDIR/bin/m2n_exec_test --nranks NRANKS --cases 1000 --json JSON|1|virtual"
  "m2n_dead_peer|$BUILDDIR/bin/m2n_exec_test --dead-peer --timeout-s 3 --nranks NRANKS --json JSON|2|nodes virtual"
  # The M2N benchmark (single tensors over layout pairs, beside the copy engine or NCCL send/recv of the same bytes
  # in the same run; docs/PERFORMANCE.md). Every destination element is checked once per case.
  "m2n_bench|$BUILDDIR/bin/m2n_bench --nranks NRANKS --max-mib 256 --json JSON|1|nodes virtual"
  # The same in place (zero-copy pull: receivers read the senders' sources) between virtual ranks.
  "m2n_bench_zero_copy|$BUILDDIR/bin/m2n_bench --nranks NRANKS --zero-copy pull --max-mib 256 --json JSON|2|virtual"
)
# The Python package's GPU tests (1 rank), on the build tree's libraries and python/ (make test-python tests the wheel
# itself, on any machine).
if python3 -c "import torch, pytest" >/dev/null 2>&1; then
  # A test that hangs prints every thread's Python stack before the run's timeout ends it (torchrun: per rank, its
  # lines prefixed with the rank by --tee).
  PYTEST_HANG="-o faulthandler_timeout=$(( ${GPU_CHECK_RUN_TIMEOUT:-300} * 3 / 4 ))"
  RUNS+=("python|env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python python3 -m pytest -q -p no:cacheprovider $PYTEST_HANG tests/python --ignore=tests/python/test_ep_jax_gpu.py --json JSON|1|")
  RUNS+=("moe_example|env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python python3 examples/moe_layer.py --json JSON|1|")
  # nccl.m2n on several ranks (torchrun; on one GPU as one-GPU nodes: conftest's --one-gpu nodes).
  # The Python overhead of Plan.execute on a whole Qwen3-32B-like model (a benchmark: 128 GB of GPU memory).
  RUNS+=("m2n_overhead|env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python python3 bench/m2n_python_overhead.py --json JSON|1|")
  RUNS+=("ep_overhead|env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python python3 bench/ep_python_overhead.py --json JSON|1|")
  if command -v torchrun >/dev/null 2>&1; then
    PYRUN="env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python torchrun --standalone --tee 3 --nproc_per_node NRANKS"
    RUNS+=("python_m2n|$PYRUN -m pytest -q -p no:cacheprovider $PYTEST_HANG tests/python/test_m2n_gpu.py --json JSON|2|nodes")
    # nccl.ep on several ranks: as one-GPU nodes, across NVLink domains (the rail exchange); test_deepep_gpu.py's
    # Low-Latency tests run at any rank count (its High-Throughput ones skip: test_deepep_ranks.py has theirs), and
    # the README's Python quick start runs as written.
    RUNS+=("python_ep_ll|$PYRUN -m pytest -q -p no:cacheprovider $PYTEST_HANG tests/python/test_ep_ll_ranks.py tests/python/test_deepep_gpu.py --json JSON|2|nodes")
    RUNS+=("python_ep_ht|$PYRUN -m pytest -q -p no:cacheprovider $PYTEST_HANG tests/python/test_ep_ht_ranks.py tests/python/test_deepep_ranks.py tests/python/test_deepep_elastic_gpu.py tests/python/test_readme_quickstart.py --json JSON|2|nodes")
    # The soak (tests/python/test_soak_gpu.py: EP dispatch + combine pairs with new routings and handles, M2N plan
    # cycles, memory flat; its docstring says the defaults a rank count gets and what the full soak needs).
    RUNS+=("python_soak|env NCCL_EXT_SOAK=1 $PYRUN -m pytest -q -p no:cacheprovider $PYTEST_HANG tests/python/test_soak_gpu.py --json JSON|1|nodes")
    # 25 calls a path: the medians of 5 swung several times from run to run over the shared loopback sockets.
    RUNS+=("m2n_colocated|$PYRUN examples/m2n_colocated.py --size 4096 --iters 25 --json JSON|2|nodes")
    RUNS+=("m2n_weight_sync|$PYRUN examples/m2n_weight_sync.py --json JSON|4|nodes")
    # A whole Qwen3-32B-like model rank 0 -> rank 1 beside per-tensor broadcast, at 1/64 of its weights' size (the
    # full size on two GPUs: bench/m2n_model_bench.py without --scale).
    RUNS+=("m2n_model|$PYRUN bench/m2n_model_bench.py --scale 8 --iters 3 --json JSON|2|nodes")
  fi
  # The DeepEP drop-in over an mpi4py communicator (TensorRT-LLM's way), under Open MPI's mpirun, where both are.
  if command -v mpirun >/dev/null 2>&1 && mpirun --version 2>&1 | grep -q "Open MPI" &&
     python3 -c "import mpi4py" >/dev/null 2>&1; then
    MPIRUN="env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python mpirun -np NRANKS --allow-run-as-root --oversubscribe -x NCCL_EXT_LIB_DIR -x PYTHONPATH -x NCCL_NVLS_ENABLE"
    RUNS+=("python_deepep_mpi|$MPIRUN python3 -m pytest -q -p no:cacheprovider $PYTEST_HANG tests/python/test_deepep_mpi_gpu.py --json JSON|2|nodes")
  else
    echo "gpu-check: no Open MPI mpirun or no mpi4py for python3: python_deepep_mpi does not run"
  fi
else
  echo "gpu-check: no torch or no pytest for python3 here: the Python tests (tests/python) do not run"
fi
# nccl.ep.jax, where the build made libnccl_ep_jax.so and python3's jax has a CUDA backend (asked in a process of its
# own that allocates nothing ahead): its GPU tests (1 rank; torchrun, on one GPU as one-GPU nodes: every process its
# own JAX runtime, jax.distributed among them) and the example (a dropless MoE layer trained against one device, a
# Low-Latency decode loop; it starts its own processes).
if [ -f "$BUILDDIR/lib/libnccl_ep_jax.so" ] &&
   XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -c "import jax; jax.devices('gpu')" >/dev/null 2>&1; then
  if [ -n "${PYRUN:-}" ]; then
    RUNS+=("python_ep_jax|$PYRUN -m pytest -q -p no:cacheprovider $PYTEST_HANG tests/python/test_ep_jax_gpu.py --json JSON|1|nodes")
  fi
  RUNS+=("jax_moe_example|env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python python3 examples/jax_moe.py --nproc NRANKS --json JSON|1|nodes")
  # The JAX pair's overhead against the C API's and torch's, 1 rank (a benchmark: the C and torch pairs in a child).
  RUNS+=("ep_jax_overhead|env NCCL_EXT_LIB_DIR=$BUILDDIR/lib PYTHONPATH=python python3 bench/ep_jax_overhead.py --json JSON|1|")
else
  echo "gpu-check: no $BUILDDIR/lib/libnccl_ep_jax.so (jaxlib's FFI headers were not found at configure time) or no JAX CUDA backend for python3: the JAX runs (python_ep_jax, jax_moe_example, ep_jax_overhead) do not run"
fi
# The same binaries started by external launchers (one process per rank, ids through NCCL_COMM_ID).
if command -v mpirun >/dev/null 2>&1; then
  RUNS+=("symmem_smoke_mpirun|mpirun --allow-run-as-root --oversubscribe -np NRANKS -x NCCL_NVLS_ENABLE=0 $BUILDDIR/bin/symmetric_memory_test --test smoke --iters 5 --json JSON|2|nodes")
fi
if command -v torchrun >/dev/null 2>&1; then
  # The C example of docs/M2N.md: an RL weight update (trainers' fp32 row shards -> inference bf16 TP shards).
  RUNS+=("m2n_c_example|torchrun --standalone --nproc_per_node NRANKS --no-python $BUILDDIR/bin/m2n_weight_update --steps 3 --json JSON|1|nodes")
  RUNS+=("symmem_smoke_torchrun|torchrun --standalone --nproc_per_node NRANKS --no-python $BUILDDIR/bin/symmetric_memory_test --test smoke --iters 5 --json JSON|2|nodes")
fi

: > "$RAW/runs.tsv"
# GPU_CHECK_PART=K/N: only every N-th run of the selection, starting at the K-th (1-based), so that N calls of at most
# a few minutes each (a device lease's per-call limit) cover the whole check between them, each with its own JSON.
PART_K=1 PART_N=1
if [ -n "${GPU_CHECK_PART:-}" ]; then
  if ! [[ $GPU_CHECK_PART =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 1 ] ||
     [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
    echo "gpu-check: GPU_CHECK_PART=$GPU_CHECK_PART: K/N with 1 <= K <= N" >&2
    exit 2
  fi
  PART_K=${BASH_REMATCH[1]} PART_N=${BASH_REMATCH[2]}
fi
SELECTED=0
# run NAME NRANKS MODE CMD: one row of the table.
run() {
  local name=$1 n=$2 mode=$3 cmd=$4
  local tag=$name
  [ "$mode" != real ] && tag="$name[$mode]"
  # GPU_CHECK_ONLY=REGEX: only the runs whose name matches (e.g. 'm2n|python'); GPU_CHECK_SKIP=REGEX: not those.
  [ -n "${GPU_CHECK_ONLY:-}" ] && ! [[ $name =~ ${GPU_CHECK_ONLY} ]] && return 0
  [ -n "${GPU_CHECK_SKIP:-}" ] && [[ $name =~ ${GPU_CHECK_SKIP} ]] && return 0
  SELECTED=$((SELECTED + 1))
  [ $(((SELECTED - 1) % PART_N)) -ne $((PART_K - 1)) ] && return 0
  local json="$RAW/$tag.$n.jsonl" log="$RAW/$tag.$n.log"
  : > "$json"
  cmd=${cmd//NRANKS/$n}
  cmd=${cmd//JSON/$json}
  [ "$mode" != real ] && cmd="$cmd --one-gpu $mode"
  echo "== $tag on $n rank(s): $cmd"
  local start end rc
  start=$(date +%s.%N)
  CURRENT=$(printf '%s\t%s\t%s\t%s\t%s' "$tag" "$n" "$start" "$json" "$log")
  # In the background, so that a signal to the check is handled at once (bash waits for a foreground command first).
  timeout -k 10 "${GPU_CHECK_RUN_TIMEOUT:-300}" $cmd >"$log" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  end=$(date +%s.%N)
  # The verdict lines first (pytest's summary too), then NCCL's warnings, counted (a failed row's log tail is in the
  # report anyway).
  grep -E "PASS|FAIL|rank .*:|error|[0-9]+ (passed|failed)" "$log" | grep -v "NCCL WARN" | head -20
  local warns
  warns=$(grep -c "WARN" "$log")
  [ "$warns" -gt 0 ] && echo "  ($warns WARN lines in the log; the first: $(grep -m1 WARN "$log" | cut -c1-160))"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$n" "$rc" "$(awk "BEGIN{print $end - $start}")" "$json" "$log" >> "$RAW/runs.tsv"
  CURRENT=""
  # GPU_CHECK_KEEP_LOGS=DIR: the whole log of every failed run is kept there (of every run: GPU_CHECK_KEEP_ALL_LOGS=1).
  [ -n "${GPU_CHECK_KEEP_LOGS:-}" ] && { [ $rc -ne 0 ] || [ -n "${GPU_CHECK_KEEP_ALL_LOGS:-}" ]; } &&
    cp "$log" "$GPU_CHECK_KEEP_LOGS/${tag//[^A-Za-z0-9_.-]/_}.$n.log"
}

# Real GPUs: every rank count the machine has.
for n in $(seq 1 "$MAXR"); do
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name cmd minr modes <<<"$spec"
    [ "$n" -lt "$minr" ] && continue
    [ "$n" -gt 1 ] && [[ $cmd != *NRANKS* ]] && continue  # a run that takes no rank count runs once
    run "$name" "$n" real "$cmd"
  done
done
# One GPU, many ranks (docs/ARCHITECTURE.md): the rank counts the machine lacks GPUs for, in both one-GPU modes.
for n in ${GPU_CHECK_ONE_GPU_RANKS-2 4}; do  # set and empty: none
  [ "$n" -le "$NGPU" ] && [ -z "${GPU_CHECK_FORCE_ONE_GPU:-}" ] && continue
  for spec in "${RUNS[@]}"; do
    IFS='|' read -r name cmd minr modes <<<"$spec"
    [ "$n" -lt "$minr" ] && continue
    for mode in $modes; do
      if [[ $mode == *:* ]]; then  # MODE:MAX: this mode up to MAX ranks only
        [ "$n" -gt "${mode#*:}" ] && continue
        mode=${mode%%:*}
      fi
      if [[ $mode == *+* ]]; then  # MODE+MIN: this mode from MIN ranks on
        [ "$n" -lt "${mode#*+}" ] && continue
        mode=${mode%%+*}
      fi
      run "$name" "$n" "$mode" "$cmd"
    done
  done
done

trap '' TERM INT
report
status=$?
trap - TERM INT
# Benchmarks (after the tests, on every GPU; with GPU_CHECK_PART, after the last part's): GPU_CHECK_BENCH=0 skips them.
if [ "${GPU_CHECK_BENCH:-1}" != 0 ] && [ $status -eq 0 ] && [ "$PART_K" = "$PART_N" ]; then  # (the last part)
  BUILDDIR=$BUILDDIR BENCH_OUT=$OUTDIR bench/run_ep_bench.sh || status=1
fi
exit $status
