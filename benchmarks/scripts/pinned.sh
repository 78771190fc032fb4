#!/usr/bin/env bash
# Run several bench commands at once on a multi-GPU host, each on its own GPU and its own share of the CPU cores
# (taskset), so one device call measures several areas. perflab's interference probe counts other work only on the
# cores a run may use, so pinned neighbours do not mark its trials busy; they still share the host's memory bandwidth
# and PCIe switches, which BENCHMARKS.md says beside figures measured this way.
#
#   benchmarks/scripts/pinned.sh OUTDIR "hotspots=python3 -m benchmarks.bench_hotspots --out /tmp/hot" "regret=..."
#
# Job i gets GPU i (CUDA_VISIBLE_DEVICES) and cores [i*k, (i+1)*k) of k = nproc / jobs; its output goes to
# OUTDIR/<name>.log; the script waits for all and prints each log's last 40 lines.
set -uo pipefail
out=$1; shift
mkdir -p "$out"
jobs=$#
gpus=$(nvidia-smi -L | wc -l)
if [ "$jobs" -gt "$gpus" ]; then echo "pinned.sh: $jobs jobs for $gpus GPUs: give at most one job per GPU" >&2; exit 2; fi
per=$(( $(nproc) / jobs ))
i=0; pids=()
for job in "$@"; do
  name=${job%%=*}; cmd=${job#*=}
  first=$(( i * per )); last=$(( first + per - 1 ))
  echo "[pinned] $name: GPU $i, cores $first-$last: $cmd"
  CUDA_VISIBLE_DEVICES=$i taskset -c "$first-$last" bash -c "$cmd" > "$out/$name.log" 2>&1 &
  pids+=($!); i=$((i + 1))
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for job in "$@"; do name=${job%%=*}; echo "===== $name"; tail -n 40 "$out/$name.log"; done
exit $status
