#!/usr/bin/env bash
# tools/gpu_check.sh stopped by signals (an outer timeout) without a GPU: a stand-in nvidia-smi and ep_ht_test (at
# 1 rank it passes at once, at more it sleeps). The report is still written: the finished row passes, the running one
# is "stopped" (exit 143) with its log so far, the rows not reached are absent, and the check exits non-zero.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/build/bin" "$tmp/out"
printf '#!/bin/sh\necho "NVIDIA stand-in GPU"\n' > "$tmp/bin/nvidia-smi"
cat > "$tmp/build/bin/ep_ht_test" <<'STUB'
#!/usr/bin/env bash
n=1 json="" prev=""
for a in "$@"; do [ "$prev" = "--nranks" ] && n=$a; [ "$prev" = "--json" ] && json=$a; prev=$a; done
echo "stand-in ep_ht_test at $n rank(s): started"
[ "$n" -gt 1 ] && { touch "$STUB_STARTED"; sleep 30; }
echo '{"test": "stand-in", "pass": true}' >> "$json"
echo "PASS"
STUB
chmod +x "$tmp/bin/nvidia-smi" "$tmp/build/bin/ep_ht_test"
cd "$root"
env PATH="$tmp/bin:$PATH" STUB_STARTED="$tmp/started" BUILDDIR="$tmp/build" GPU_CHECK_OUT="$tmp/out" GPU_CHECK_ONLY='^ep_ht$' \
  GPU_CHECK_ONE_GPU_RANKS=2 GPU_CHECK_BENCH=0 bash tools/gpu_check.sh > "$tmp/log" 2>&1 &
check=$!
# Once the second row runs, SIGTERM twice, 50 ms apart, as an outer `timeout` does (to the check, then to its process
# group): the second must not cut the report short.
for _ in $(seq 100); do [ -f "$tmp/started" ] && break; sleep 0.1; done
kill -TERM $check; sleep 0.05; kill -TERM $check 2>/dev/null
( sleep 20; kill -KILL $check 2>/dev/null ) > /dev/null 2>&1 &
watchdog=$!
wait $check
rc=$?
kill $watchdog 2>/dev/null
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: a stopped check exited 0"; fail=1; }
python3 - "$tmp/out" <<'PY' || fail=1
import glob, json, sys
files = glob.glob(sys.argv[1] + "/gpu-check-*.json")
if len(files) != 1:
    sys.exit("FAIL: %d reports written (want 1)" % len(files))
runs = json.load(open(files[0]))["runs"]
rows = [(r["name"], r["nranks"], r["status"]) for r in runs]
want = [("ep_ht", 1, "pass"), ("ep_ht[nodes]", 2, "FAIL: stopped (gpu-check got a signal during this run)")]
if rows != want:
    sys.exit("FAIL: rows %s, want %s" % (rows, want))
tail = runs[1]["log_tail"]
if "started" not in tail:
    sys.exit("FAIL: the stopped row's log tail lacks its output so far: %r" % tail)
PY
[ $fail -eq 0 ] && echo "PASS: gpu_check_stop" || tail -20 "$tmp/log"
exit $fail
