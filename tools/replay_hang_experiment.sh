#!/usr/bin/env bash
# tools/replay_hang_experiment.sh [OUT_DIR]: the GPU experiment that settles the mixed mode's back-to-back replay hang
# (docs/ARCHITECTURE.md, "Back-to-back replays in the mixed mode"). RelayProtocol.* shows the relayed exchange cannot
# hang by itself and that two ranks' kernels in one hardware queue can; this runs
#   ep_ll_test --one-gpu mixed --nranks 4 --graph-only --back-to-back
# with CUDA_DEVICE_MAX_CONNECTIONS at 1, the default (8) and 32, and at the default with NCCL_GRAPH_MIXING_SUPPORT=0,
# each under a timeout, and writes one JSON line a setting (exit code, seconds, timed out or not) to
# OUT_DIR/replay-hang.jsonl (default: bench/results). Reading: a pass at 32 with a hang at 8 proves the shared hardware
# queue; a failure at 32 too (as on one H100, bench/results/replay-hang-20261206T0339Z.jsonl) points at NCCL's host
# side instead, and a pass without NCCL's graph-mixing mechanism names it. Every run has its own timeout
# (REPLAY_TIMEOUT_S, default 120 s); the test's device-wait budget stays its own unless REPLAY_TEST_ARGS (more
# ep_ll_test arguments, e.g. "--timeout-s 40") says otherwise. REPLAY_DUMP_AFTER_S=N: NCCL dumps its proxies' state
# (NCCL_PROXY_DUMP_SIGNAL=10) when, N seconds into each run, every rank process gets SIGUSR1; that run's whole log is
# kept beside the JSON (replay-hang-<setting>.log). Needs a build (make all) and a GPU; exit 77 without them.
set -uo pipefail
out=${1:-bench/results}
bin=${BUILDDIR:-build}/bin/ep_ll_test
limit=${REPLAY_TIMEOUT_S:-120}
if [ ! -x "$bin" ]; then
  echo "replay_hang_experiment: no $bin (make all first)" >&2
  exit 77
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "replay_hang_experiment: no GPU visible" >&2
  exit 77
fi
mkdir -p "$out"
json=$out/replay-hang.jsonl
# Each setting: CUDA_DEVICE_MAX_CONNECTIONS (or the default), then, after a colon, one more VAR=VALUE: the last one
# turns off NCCL's mechanism for mixing captured and uncaptured operations, which NCCL's docs say has deadlocked CUDA
# when several communicators' graphs are launched in one process (the mixed mode's virtual ranks are such).
# REPLAY_SETTINGS: other settings in the same form (e.g. "default:NCCL_LAUNCH_ORDER_IMPLICIT=1").
for setting in ${REPLAY_SETTINGS:-1 default 32 default:NCCL_GRAPH_MIXING_SUPPORT=0}; do
  connections=${setting%%:*}
  extra=()
  [ "$setting" != "$connections" ] && extra=("${setting#*:}")
  log=$(mktemp)
  start=$(date +%s.%N)
  read -r -a test_args <<<"${REPLAY_TEST_ARGS:-}"
  dump=() dumper=
  # stdbuf: NCCL prints the dump with printf, which a file would otherwise hold in a buffer a killed rank never flushes.
  [ -n "${REPLAY_DUMP_AFTER_S:-}" ] && dump=(NCCL_PROXY_DUMP_SIGNAL=10 stdbuf -oL)
  queues=(CUDA_DEVICE_MAX_CONNECTIONS="$connections")
  [ "$connections" = default ] && queues=(-u CUDA_DEVICE_MAX_CONNECTIONS)
  timeout "$limit" env "${queues[@]}" ${extra[@]+"${extra[@]}"} ${dump[@]+"${dump[@]}"} "$bin" --one-gpu mixed \
    --nranks 4 --graph-only --back-to-back ${test_args[@]+"${test_args[@]}"} >"$log" 2>&1 &
  run=$!
  if [ -n "${REPLAY_DUMP_AFTER_S:-}" ]; then
    # The rank processes are the launcher's children (the launcher itself has no handler: SIGUSR1 would end it).
    (sleep "$REPLAY_DUMP_AFTER_S"
     for pid in $(pgrep -f "$bin"); do
       parent=$(ps -o ppid= -p "$pid" | tr -d ' ')
       [ -n "$parent" ] && [ "$(ps -o comm= -p "$parent")" = "$(basename "$bin")" ] && kill -USR1 "$pid" 2>/dev/null
     done) &
    dumper=$!
  fi
  wait "$run"
  rc=$?
  [ -n "${dumper:-}" ] && kill "$dumper" 2>/dev/null
  seconds=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$start" "$(date +%s.%N)")
  timed_out=false
  [ "$rc" -eq 124 ] && timed_out=true
  python3 - "$json" "$connections" "${extra[*]}" "$rc" "$seconds" "$timed_out" "$log" "${REPLAY_TEST_ARGS:-}" \
    "${REPLAY_DUMP_AFTER_S:-}" <<'EOF'
import json, sys
path, connections, extra, rc, seconds, timed_out, log, test_args, dump_after = sys.argv[1:]
tail = open(log, errors="replace").read()[-2000:]
line = {"test": "replay_hang_experiment", "cuda_device_max_connections": connections, "env": extra, "rc": int(rc),
        "pass": rc == "0", "timed_out": timed_out == "true", "seconds": float(seconds), "log_tail": tail}
if test_args:
    line["test_args"] = test_args
if dump_after:
    line["proxy_dump_after_s"] = float(dump_after)
with open(path, "a") as f:
    f.write(json.dumps(line) + "\n")
print("replay_hang_experiment: CUDA_DEVICE_MAX_CONNECTIONS=%s%s -> rc %s in %s s%s" % (
    connections, " " + extra if extra else "", rc, seconds, " (timed out)" if timed_out == "true" else ""))
EOF
  [ -n "${REPLAY_DUMP_AFTER_S:-}" ] && cp "$log" "$out/replay-hang-${setting//[^A-Za-z0-9=_.-]/_}.log"
  rm -f "$log"
done
echo "replay_hang_experiment: results in $json"
