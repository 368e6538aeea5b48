#!/usr/bin/env bash
# DeepEP's own tests, unchanged, on nccl.ep's drop-in (python/nccl/ep/deepep.py, deepep_elastic.py), every process
# on GPU 0 as a one-GPU node of its own.
#
#   tools/deepep_tests.sh [--dry-run] DEEPEP_SRC [NPROC...]      (NPROC: default 2 4)
#
# DEEPEP_SRC is a work tree of DeepEP (github.com/deepseek-ai/DeepEP). From a bare mirror, either
#   git -C <mirror> worktree add /tmp/deepep HEAD            (a git work tree: its commit is read from it), or
#   mkdir /tmp/deepep && git -C <mirror> archive HEAD | tar -x -C /tmp/deepep &&
#     git -C <mirror> rev-parse HEAD > /tmp/deepep/DEEPEP_COMMIT          (an archive: the commit from that file)
# Nothing of DeepEP is built or committed here. For each NPROC it runs, from DEEPEP_SRC:
#   tests/legacy/test_intranode.py --num-processes NPROC
#   tests/legacy/test_low_latency.py --num-processes NPROC                  (and with --shrink-test, if it has it,
#                                                                            from 6 processes: its failed ranks are
#                                                                            1, 3 and 5)
#   tests/elastic/test_ep.py --num-processes NPROC                          (as it is: timing, then checks)
#   tests/elastic/test_ep.py --num-processes NPROC --skip-perf-test         (the checks alone; and with
#                                                                            --do-cpu-sync 0)
# with `import deep_ep` resolving to a package made in a temporary folder, first on PYTHONPATH:
#   deep_ep/__init__.py  nccl.ep.deepep's Buffer, Config, EventOverlap, topk_idx_t and V2's ElasticBuffer, EPHandle,
#                        EventHandle;
#   deep_ep/utils/       DeepEP's own pure-Python test utilities, copied from DEEPEP_SRC at run time;
#   deep_ep/_C.py        the names of DeepEP's compiled module those utilities import (calling one raises);
#   sitecustomize.py     run by every Python process of the tests (torch.multiprocessing.spawn's children too):
#                        torch.cuda.set_device(i) sets device 0, and torch.distributed.init_process_group gives the
#                        process NCCL_HOSTID=deepep-node-<rank> (an NCCL node of its own) and device_id cuda:0.
# The tests' files are run as they are; extra arguments for every run of a file: DEEPEP_INTRANODE_ARGS,
# DEEPEP_LOW_LATENCY_ARGS, DEEPEP_EP_ARGS. DEEPEP_TESTS_TIMEOUT: seconds a run may take (default 1800).
# DEEPEP_TESTS_ONLY: a bash regex; only the runs whose file and arguments (as listed above, single spaces, none at the
# end) match it, e.g. 'test_ep.py --num-processes 2 --skip-perf-test$'.
# --dry-run (no GPU needed): the same runs, but torch.multiprocessing.spawn returns at once, so that each file
# parses its arguments and imports everything it imports through the drop-in, then stops.
# The log (the commits, the GPU, every run's output and a summary) goes to $OUT/deepep-tests-<UTC>.log when OUT is
# set, else bench/results/deepep-tests-<UTC>.log. Exit status: 0 when every run passed (dry run: imported).
# Environment: NCCL_EXT_LIB_DIR (default build/lib), PYTHON (default python3), NCCL_SOCKET_NTHREADS and
# NCCL_NSOCKS_PERTHREAD (default 4 and 4: more loopback connections than NCCL's own default), NCCL_P2P_NET_CHUNKSIZE
# (default 524288: the rail's ncclSend / ncclRecv in messages of 512 KiB, not 128 KiB; over loopback sockets every
# message costs the proxy thread, docs/PERFORMANCE.md section 6).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

dry=0
if [ "${1:-}" = "--dry-run" ]; then
  dry=1
  shift
fi
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  exit 2
fi
src=$(cd "$1" && pwd)
shift
nprocs=("$@")
[ ${#nprocs[@]} -gt 0 ] || nprocs=(2 4)
py=${PYTHON:-python3}
timeout_s=${DEEPEP_TESTS_TIMEOUT:-1800}
for f in tests/legacy/test_intranode.py tests/legacy/test_low_latency.py tests/elastic/test_ep.py deep_ep/utils; do
  if [ ! -e "$src/$f" ]; then
    echo "deepep-tests: $src has no $f (not a DeepEP work tree?)" >&2
    exit 2
  fi
done
if [ "$dry" = 0 ] && ! nvidia-smi --query-gpu=name --format=csv,noheader >/dev/null 2>&1; then
  echo "deepep-tests: no GPU here (nvidia-smi lists none); --dry-run checks the imports without one" >&2
  exit 2
fi

deepep_commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || cat "$src/DEEPEP_COMMIT" 2>/dev/null || echo unknown)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  log=$OUT/deepep-tests-$stamp.log
else
  mkdir -p "$root/bench/results"
  log=$root/bench/results/deepep-tests-$stamp.log
fi

# -- the temporary deep_ep package --------------------------------------------------------------------------------
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
mkdir -p "$shim/deep_ep"
cp -r "$src/deep_ep/utils" "$shim/deep_ep/utils"
cat >"$shim/deep_ep/__init__.py" <<'EOF'
"""deep_ep for DeepEP's own tests: nccl.ep's drop-in (made by tools/deepep_tests.sh; utils/ is DeepEP's)."""
from nccl.ep.deepep import Buffer, Config, EventOverlap, topk_idx_t  # noqa: F401  (DeepEP's V1 API)
from nccl.ep.deepep import ElasticBuffer, EPHandle, EventHandle  # noqa: F401  (DeepEP's V2 API)
from .utils.envs import get_logical_domain_size, get_physical_domain_size  # noqa: F401,E402
EOF
cat >"$shim/deep_ep/_C.py" <<'EOF'
"""The names of DeepEP's compiled deep_ep._C that its pure-Python utilities import (made by tools/deepep_tests.sh):
the drop-in's where it has them; calling any other raises."""
from nccl.ep.deepep import Config, EventHandle, topk_idx_t  # noqa: F401


def _absent(name):
    def call(*args, **kwargs):
        raise NotImplementedError("deep_ep._C.%s: DeepEP's compiled runtime is not part of nccl.ep's drop-in" % name)

    return call


for _name in ("get_local_nccl_unique_id", "create_nccl_comm", "destroy_nccl_comm", "get_physical_domain_size",
              "get_logical_domain_size", "init_jit", "calculate_elastic_buffer_size", "get_elastic_buffer_alignment"):
    globals()[_name] = _absent(_name)
EOF
cat >"$shim/sitecustomize.py" <<'EOF'
"""Every process of DeepEP's tests on GPU 0, each an NCCL node of its own (made by tools/deepep_tests.sh)."""
import functools
import os

if os.environ.get("DEEPEP_SHIM") == "1":
    import torch
    import torch.distributed as dist
    import torch.multiprocessing

    _set_device = torch.cuda.set_device

    def set_device(device):
        _set_device(0)

    torch.cuda.set_device = set_device
    _init_process_group = dist.init_process_group

    @functools.wraps(_init_process_group)
    def init_process_group(*args, **kwargs):
        os.environ["NCCL_HOSTID"] = "deepep-node-%s" % kwargs.get("rank", os.environ.get("RANK", "0"))
        if kwargs.get("device_id") is not None:
            kwargs["device_id"] = torch.device("cuda", 0)
        return _init_process_group(*args, **kwargs)

    dist.init_process_group = init_process_group
    if os.environ.get("DEEPEP_SHIM_DRY_RUN") == "1":
        def spawn(fn, args=(), nprocs=1, **kwargs):
            import deep_ep

            print("deepep-tests (dry run): would spawn %d processes of %s; deep_ep.Buffer = %s, deep_ep.ElasticBuffer "
                  "= %s" % (nprocs, fn.__name__, deep_ep.Buffer, deep_ep.ElasticBuffer), flush=True)

        torch.multiprocessing.spawn = spawn
EOF

export DEEPEP_SHIM=1 DEEPEP_SHIM_DRY_RUN=$dry
export PYTHONPATH=$shim:$root/python${PYTHONPATH:+:$PYTHONPATH}
export NCCL_EXT_LIB_DIR=${NCCL_EXT_LIB_DIR:-$root/build/lib}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}  # the one-GPU nodes meet over loopback
export NCCL_NVLS_ENABLE=0                            # NVLink multicast is forbidden on our machines
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Every byte between the processes crosses loopback sockets, and more connections move it faster (256 MiB Shard(0) ->
# Shard(1) at 4 one-GPU nodes, nccl_m2n and NCCL send/recv alike: 1.4 to 1.7 times, docs/PERFORMANCE.md section 6);
# DeepEP's timing loops at 4 processes need it to fit a GPU call. Either variable set beforehand wins.
export NCCL_SOCKET_NTHREADS=${NCCL_SOCKET_NTHREADS:-4} NCCL_NSOCKS_PERTHREAD=${NCCL_NSOCKS_PERTHREAD:-4}
export NCCL_P2P_NET_CHUNKSIZE=${NCCL_P2P_NET_CHUNKSIZE:-524288}

# -- the runs -------------------------------------------------------------------------------------------------------
{
  echo "deepep-tests $stamp$([ "$dry" = 1 ] && echo " (dry run: imports only, nothing spawned)")"
  echo "DeepEP: $src, commit $deepep_commit"
  dirty=$(git -C "$root" diff --quiet 2>/dev/null || echo " + uncommitted changes")
  echo "nccl-ext: $(git -C "$root" rev-parse HEAD 2>/dev/null)$dirty"
  # The tree that ran, whatever the checkout's git metadata says (a copied working tree): compare with the same
  # function on a clone of a commit, as gpu-check's source_sha1.
  sha='import sys; sys.path.insert(0, "tools"); import gpu_check_report as g; print(g.source_sha1())'
  echo "sources: $(cd "$root" && python3 -c "$sha" 2>&1 | tail -1)"
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  versions='import torch; print(torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'
  echo "torch: $("$py" -c "$versions" 2>&1 | tail -1)"
  echo "processes: ${nprocs[*]} (each on GPU 0, its own NCCL node)"
  echo "sockets: NCCL_SOCKET_NTHREADS=$NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD=$NCCL_NSOCKS_PERTHREAD" \
    "NCCL_P2P_NET_CHUNKSIZE=$NCCL_P2P_NET_CHUNKSIZE"
} | tee "$log"

read -r -a intranode_args <<<"${DEEPEP_INTRANODE_ARGS:-}"
read -r -a low_latency_args <<<"${DEEPEP_LOW_LATENCY_ARGS:-}"
read -r -a ep_args <<<"${DEEPEP_EP_ARGS:-}"
runs=()
skipped=()
for n in "${nprocs[@]}"; do
  runs+=("tests/legacy/test_intranode.py --num-processes $n ${intranode_args[*]}")
  runs+=("tests/legacy/test_low_latency.py --num-processes $n ${low_latency_args[*]}")
  # --shrink-test fails ranks 1, 3 and 5 (at dispatch, combine and clean) and then expects all three masked: it
  # cannot pass below 6 processes, on DeepEP either.
  if grep -q -- "--shrink-test" "$src/tests/legacy/test_low_latency.py"; then
    if [ "$n" -ge 6 ]; then
      runs+=("tests/legacy/test_low_latency.py --num-processes $n --shrink-test ${low_latency_args[*]}")
    else
      skipped+=("$(printf '%-16s %5ss  %s' "SKIP (< 6 ranks)" 0 "tests/legacy/test_low_latency.py --num-processes $n --shrink-test")")
    fi
  fi
  # test_ep.py checks its results after timing them in each case (bench_kineto looks DeepEP's kernels up by name):
  # the runs with --skip-perf-test check them whatever the timing step does.
  runs+=("tests/elastic/test_ep.py --num-processes $n ${ep_args[*]}")
  runs+=("tests/elastic/test_ep.py --num-processes $n --skip-perf-test ${ep_args[*]}")
  runs+=("tests/elastic/test_ep.py --num-processes $n --skip-perf-test --do-cpu-sync 0 ${ep_args[*]}")
done

summary=()
failed=0
port=$((29600 + $$ % 200))
for run in "${runs[@]}"; do
  run=${run% }
  [[ -z ${DEEPEP_TESTS_ONLY:-} || $run =~ $DEEPEP_TESTS_ONLY ]] || continue
  read -r -a argv <<<"$run"
  port=$((port + 1))
  echo "=== $run" | tee -a "$log"
  start=$(date +%s)
  (cd "$(dirname "$src/${argv[0]}")" &&
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout --kill-after=30 "$timeout_s" "$py" "$src/${argv[0]}" \
      "${argv[@]:1}") 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  secs=$(($(date +%s) - start))
  verdict=PASS
  [ "$dry" = 1 ] && verdict="IMPORTED"
  [ "$rc" = 0 ] || verdict="FAIL (exit $rc)"
  [ "$rc" = 124 ] && verdict="FAIL (timeout after ${timeout_s} s)"
  [ "$rc" = 0 ] || failed=1
  echo "=== $verdict in ${secs} s: $run" | tee -a "$log"
  summary+=("$(printf '%-16s %5ss  %s' "$verdict" "$secs" "$run")")
done
{
  echo "=== summary (DeepEP $deepep_commit)"
  printf '%s\n' "${summary[@]}" ${skipped[@]+"${skipped[@]}"}
  echo "log: $log"
} | tee -a "$log"
exit $failed
