#!/usr/bin/env bash
# One runner for the work the records under data/ come from, on a lent GPU machine (after the Warp set-up runs of
# tools/gpu/README.md). Every job writes under $OUT; every benchmark record carries device, versions and date, and
# the forward ones the tag given here (FOVI_TAG, default the job's name).
#
#   bash tools/gpu/run.sh forward   [bench args]  # the forward benchmark as a user runs it: the rule's pick eager
#                                                   # and replayed, its dense ceiling, every PyTorch baseline
#   bash tools/gpu/run.sh sweep     [bench args]  # every registered forward config on every layer (--all-configs)
#   bash tools/gpu/run.sh train-step [bench args] # forward + dx + dW, eager and replayed, every PyTorch baseline
#   bash tools/gpu/run.sh backward  [bench args]  # the adjoint benchmark (staged and fused)
#   bash tools/gpu/run.sh network   [bench args]  # fovi's networks with fovi_lab inside, beside fovi's backends
#                                                   # (needs fovi: bash .device/fovi/install.sh, tools/gpu/stage_fovi.sh)
#   bash tools/gpu/run.sh host      [bench args]  # the host work of eager calls, kernels counted and not run
#   bash tools/gpu/run.sh parity                  # warmup, then every GPU test file (junit XML under $OUT)
#   bash tools/gpu/run.sh all [B ...]             # parity, then train-step and forward at these batches (16 64),
#                                                   # each job bounded by what is left of FOVI_TIMEOUT
#   bash tools/gpu/run.sh networks-fovi           # no Warp needed (the set-up's first call): fovi's backends and
#                                                   # the stubbed step in both networks at B = 64 and 256, eager and
#                                                   # graphed; kept in $FOVI_GPU_SCRATCH (/tmp) for the next
#                                                   # call's fovi_lab rows
#   bash tools/gpu/run.sh steps                   # one call's worth: warmup (scalar tile GEMMs), the stems'
#                                                   # dx under FOVI_KNN_DX_PATH=taps beside the rule, the train step
#                                                   # over the 13 layers at B = 16 and 64 beside fovi's backends
#                                                   # (default cuBLASDx tile GEMMs), GPU parity, the networks with
#                                                   # fovi_lab (against networks-fovi's records where that ran, else
#                                                   # with fovi's backends), ResNet-18 with the stem's dx on taps,
#                                                   # the kernels of three steps that lose (profile_step), the host
#                                                   # work in what is left
#   bash tools/gpu/run.sh finish                  # the call after steps: fovi_lab's memory traces, the train step
#                                                   # at B = 512, ResNet-18 eager with fovi's fastest in one process,
#                                                   # in-place against auto
#   bash tools/gpu/run.sh fovi-layers [LAYERS]    # the train step (then the forward) on fovi's own network layers
#                                                   # (default fovi:resnet18@64 fovi:alexnet@64) beside fovi's
#                                                   # backends, B = 16, 64, 256, eager and replayed
#   bash tools/gpu/run.sh memory [BACKEND ...]    # where each backend's memory goes in both networks at B = 64 and
#                                                   # 256, eager and graphed (bench network --memory-trace)
#   bash tools/gpu/run.sh budgets                 # the memory rules: the outer-capture and in-place replay tests,
#                                                   # fovi_lab in both networks, ResNet-18 eager in place, the train
#                                                   # step on fovi's stem and AlexNet conv1
#   bash tools/gpu/run.sh networks-all            # the next call on the same machine: the tile GEMMs built both
#                                                   # ways on three layers, AlexNet at 64, both networks at 256, the
#                                                   # forward over the 13 layers, fovi's backends per layer
#   bash tools/gpu/run.sh in-place                # FOVI_KNN_REPLAY=in-place against auto: its GPU test, the train
#                                                   # step over the 13 layers at B = 16 and 64, the host work and
#                                                   # ResNet-18's eager step, each mode in turn (after warmup)
#   bash tools/gpu/run.sh ddp                     # two GPUs of one host: bench ddp (warp_train, torch_compact), ops
#                                                   # on cuda:1, the autotune cache under DDP
#   bash tools/gpu/run.sh ncu TARGETS...          # Nsight Compute on layer:B:config[:dense] targets
#   bash tools/gpu/run.sh notebooks [nb ...]      # notebooks with their gpu cells (tools/gpu/run_notebooks.sh)
#
# FOVI_TIMEOUT (seconds, default 560) bounds each job inside the device's 10-minute call.
set -uo pipefail
job="${1:?usage: run.sh forward|sweep|train-step|backward|network|host|parity|all|networks-fovi|steps|finish|fovi-layers|memory|budgets|networks-all|in-place|ddp|ncu|notebooks [args]}"; shift
source "$(dirname "$0")/device_env.sh"
limit="${FOVI_TIMEOUT:-560}"
tag="${FOVI_TAG:-$job}"
# seconds left of the job's limit, and a timeout of at most $1 seconds within them
left() { echo $(( limit - ($(date +%s) - t0) )); }
cap() { local L; L=$(left); [ "$L" -lt "$1" ] && echo $(( L > 5 ? L - 3 : 1 )) || echo "$1"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='tree at %h (%cs)' 2>/dev/null || true
case "$job" in
  forward)
    timeout "$limit" python3 -m fovi_lab.bench.forward --graphs --no-cached --reps 20 --warmup 3 \
      --batches 1 4 16 32 64 128 512 --time-budget-s $(( limit - 30 )) --tag "$tag" --out "$OUT/forward.jsonl" "$@" ;;
  sweep)
    timeout "$limit" python3 -m fovi_lab.bench.forward --all-configs --op-all --graphs --no-compile --no-cached \
      --time-budget-s $(( limit - 30 )) --tag "$tag" --out "$OUT/forward_sweep.jsonl" "$@" ;;
  train-step)
    timeout "$limit" python3 -m fovi_lab.bench.backward train-step --graphs --time-budget-s $(( limit - 30 )) \
      --out "$OUT/train_step.jsonl" "$@" ;;
  backward)
    timeout "$limit" python3 -m fovi_lab.bench.backward backward --time-budget-s $(( limit - 30 )) \
      --out "$OUT/backward.jsonl" "$@" ;;
  network)
    timeout "$limit" python3 -m fovi_lab.bench.network --batches 64 256 --out "$OUT/network.jsonl" "$@" ;;
  host)
    timeout "$limit" python3 -m fovi_lab.bench.host --layers all --batches 16 64 --fovi fovi_lab cuda auto \
      --out "$OUT/host.jsonl" "$@" ;;
  parity)
    python3 -m fovi_lab warmup --no-dense --experimental --mathdx off --jobs 16 > "$OUT/warmup.log" 2>&1
    tail -1 "$OUT/warmup.log"
    FOVI_WARP_MATHDX=0 timeout "$limit" python3 -m pytest -o addopts="" -p no:cacheprovider -q \
      tests/kernels/test_gpu_parity.py tests/ops/test_gpu_replay.py tests/ops/test_gpu_torch_native.py \
      --junitxml="$OUT/parity.xml" "$@" 2>&1 | tail -5 ;;
  all)
    batches=("$@"); [ ${#batches[@]} -gt 0 ] || batches=(16 64)
    export FOVI_WARP_MATHDX=0          # the scalar tile GEMM: no MathDx module to compile inside the call
    python3 -m fovi_lab warmup --no-dense --experimental --mathdx off --jobs 16 > "$OUT/warmup.log" 2>&1
    tail -1 "$OUT/warmup.log"; echo "warmup done at $(( $(date +%s) - t0 )) s"
    timeout $(( $(left) * 2 / 5 )) python3 -m pytest -o addopts="" -p no:cacheprovider -q \
      tests/kernels/test_gpu_parity.py tests/ops/test_gpu_replay.py tests/ops/test_gpu_torch_native.py \
      --junitxml="$OUT/parity.xml" > "$OUT/parity.log" 2>&1
    tail -5 "$OUT/parity.log"; echo "parity done at $(( $(date +%s) - t0 )) s"
    timeout $(( $(left) * 3 / 5 )) python3 -m fovi_lab.bench.backward train-step --graphs \
      --batches "${batches[@]}" --time-budget-s $(( $(left) / 2 )) --out "$OUT/train_step.jsonl" > "$OUT/train_step.log" 2>&1
    tail -3 "$OUT/train_step.log"; echo "train-step done at $(( $(date +%s) - t0 )) s"
    [ "$(left)" -gt 90 ] && timeout $(( $(left) - 5 )) python3 -m fovi_lab.bench.forward --graphs --no-cached --no-compile --reps 20 --warmup 3 \
      --batches "${batches[@]}" --time-budget-s $(( $(left) - 40 )) --tag "$tag" --out "$OUT/forward.jsonl" > "$OUT/forward.log" 2>&1
    tail -3 "$OUT/forward.log" ;;
  networks-fovi)
    # fovi's backends need no Warp, so the set-up's first call times them; the next call's fovi_lab rows take their
    # speedups over these (bench network --alternatives: same machine, boot, commit and device)
    cat /proc/sys/kernel/random/boot_id
    mkdir -p "$scratch/fovi_lab_out"
    for b in 64 256; do
      timeout "$(cap 270)" python3 -m fovi_lab.bench.network --net resnet18 alexnet --batches "$b" --modes eager \
        graphed --backends auto cuda baseline torch_compact stubbed --out "$OUT/network_fovi.jsonl" \
        > "$OUT/network_fovi_$b.log" 2>&1
      tail -12 "$OUT/network_fovi_$b.log"
    done
    cp "$OUT/network_fovi.jsonl" "$scratch/fovi_lab_out/"
    # where fovi's fused kernel and the rest of the network put their memory, in what is left
    [ "$(left)" -gt 60 ] && FOVI_TIMEOUT=$(( $(left) - 3 )) bash "$0" memory cuda stubbed ;;
  fovi-layers)
    # the train step on the layers of fovi's own networks (fovi:<net>@<in_res>, built from fovi's tables) beside
    # fovi's backends and PyTorch's, eager and replayed, B = 16, 64 and 256; then the forward in what is left
    layers=("$@"); [ ${#layers[@]} -gt 0 ] || layers=(fovi:resnet18@64 fovi:alexnet@64)
    c=$(cap 400); timeout "$c" python3 -m fovi_lab.bench.backward train-step --graphs --batches 16 64 256 \
      --layers "${layers[@]}" --jobs 16 --time-budget-s $(( c - 40 )) --out "$OUT/train_step_fovi_layers.jsonl" \
      > "$OUT/fovi_layers.log" 2>&1
    tail -30 "$OUT/fovi_layers.log"
    [ "$(left)" -gt 60 ] && timeout $(( $(left) - 3 )) python3 -m fovi_lab.bench.forward --graphs --no-cached \
      --no-compile --reps 20 --warmup 3 --batches 16 64 256 --layers "${layers[@]}" --time-budget-s $(( $(left) - 40 )) \
      --tag "$tag" --out "$OUT/forward_fovi_layers.jsonl" > "$OUT/forward_fovi_layers.log" 2>&1
    tail -8 "$OUT/forward_fovi_layers.log" ;;
  memory)
    # where each backend's memory goes (bench network --memory-trace): every allocation of each run recorded with its
    # stack, the live set at the peak by the code that allocated it; the records are marked note_run (the recording
    # slows the host), so no table reads their times
    backends=("$@"); [ ${#backends[@]} -gt 0 ] || backends=(fovi_lab cuda stubbed)
    for net in resnet18 alexnet; do
      timeout "$(cap 200)" python3 -m fovi_lab.bench.network --net "$net" --batches 64 256 --modes eager graphed \
        --steps 2 --backends "${backends[@]}" --memory-trace --out "$OUT/network_memory.jsonl" \
        > "$OUT/memory_$net.log" 2>&1
      grep -v "at the peak" "$OUT/memory_$net.log" | tail -12
    done ;;
  budgets)
    # the memory rules on one call: the replay tests of an outer capture and of in-place graphs, fovi_lab's step in
    # both networks (eager and graphed, B = 64 and 256; against networks-fovi's records of this boot where that ran),
    # ResNet-18's
    # eager step under FOVI_KNN_REPLAY=in-place, then the train step on the layers the budgets chunk (fovi's stem
    # and AlexNet conv1) beside fovi's backends
    timeout "$(cap 120)" python3 -m pytest -o addopts="" -p no:cacheprovider -q tests/ops/test_gpu_replay.py \
      -k "outer_capture or in_place" --junitxml="$OUT/replay.xml" > "$OUT/replay.log" 2>&1
    tail -4 "$OUT/replay.log"; echo "replay tests done at $(( $(date +%s) - t0 )) s"
    alt=(); [ -f "$scratch/fovi_lab_out/network_fovi.jsonl" ] && alt=(--alternatives "$scratch/fovi_lab_out/network_fovi.jsonl")
    for net in resnet18 alexnet; do
      timeout "$(cap 110)" python3 -m fovi_lab.bench.network --net "$net" --batches 64 256 --modes eager graphed \
        --steps 10 --backends fovi_lab ${alt[@]+"${alt[@]}"} --out "$OUT/network.jsonl" 2>&1 | grep -v "^\["
    done
    FOVI_KNN_REPLAY=in-place timeout "$(cap 80)" python3 -m fovi_lab.bench.network --net resnet18 --batches 64 256 \
      --modes eager --steps 10 --backends fovi_lab ${alt[@]+"${alt[@]}"} --out "$OUT/network.jsonl" 2>&1 | grep -v "^\["
    [ "$(left)" -gt 40 ] && timeout "$(( $(left) - 5 ))" python3 -m fovi_lab.bench.backward train-step --graphs \
      --batches 64 256 --layers fovi:resnet18@64:0 fovi:alexnet@64:1 --time-budget-s $(( $(left) - 25 )) \
      --out "$OUT/train_step_fovi_layers.jsonl" > "$OUT/fovi_layers.log" 2>&1
    grep -v "^\[" "$OUT/fovi_layers.log" | tail -25 ;;
  steps)
    cat /proc/sys/kernel/random/boot_id
    # the kernels compile into a cache the next call on this machine finds (device_env.sh points Warp at it there)
    mkdir -p "$scratch/wpc/wpcache" && export WARP_CACHE_PATH="$scratch/wpc/wpcache"
    FOVI_WARP_MATHDX=0 timeout 110 python3 -m fovi_lab warmup --no-dense --experimental --mathdx off --jobs 16 \
      > "$OUT/warmup.log" 2>&1
    tail -1 "$OUT/warmup.log"; echo "warmup done at $(( $(date +%s) - t0 )) s"
    # the stems' dx on the tap-expanded layer (FOVI_KNN_DX_PATH=taps) beside the rule's staged dx, each way on the same
    # shapes in the same order (the most used stem first), warp_train alone (--only: PyTorch's forms come next)
    for mode in taps auto; do
      c=$(cap 75); FOVI_KNN_DX_PATH=$mode timeout "$c" python3 -m fovi_lab.bench.backward train-step --graphs \
        --only warp_train --no-fovi --batches 16 64 512 --layers res18_stem dinov3_patch res18_stem_rf2 alex_L0 \
        --jobs 16 --time-budget-s $(( c > 30 ? c - 25 : 5 )) --out "$OUT/train_step_dx_$mode.jsonl" \
        > "$OUT/dx_$mode.log" 2>&1
      grep -E "warp_train .*ms|warp_train_graphed" "$OUT/dx_$mode.log" | cut -c1-150 | tail -12
    done; echo "dx taps done at $(( $(date +%s) - t0 )) s"
    c=$(cap 170); timeout "$c" python3 -m fovi_lab.bench.backward train-step --graphs --batches 16 64 \
      --layers all --jobs 16 --time-budget-s $(( c - 35 )) --out "$OUT/train_step.jsonl" > "$OUT/train_step.log" 2>&1
    tail -4 "$OUT/train_step.log"; echo "train-step done at $(( $(date +%s) - t0 )) s"
    FOVI_WARP_MATHDX=0 timeout "$(cap 90)" python3 -m pytest -o addopts="" -p no:cacheprovider -q \
      tests/kernels/test_gpu_parity.py tests/ops/test_gpu_replay.py tests/ops/test_gpu_torch_native.py \
      --junitxml="$OUT/parity.xml" > "$OUT/parity.log" 2>&1
    tail -6 "$OUT/parity.log"; echo "parity done at $(( $(date +%s) - t0 )) s"
    fovi_recs="$scratch/fovi_lab_out/network_fovi.jsonl"       # fovi's backends timed by networks-fovi
    if [ -f "$fovi_recs" ]; then
      timeout "$(cap 100)" python3 -m fovi_lab.bench.network --net alexnet resnet18 --batches 256 64 --modes eager \
        graphed --backends fovi_lab --alternatives "$fovi_recs" --out "$OUT/network.jsonl" > "$OUT/network.log" 2>&1
    else
      timeout "$(cap 120)" python3 -m fovi_lab.bench.network --net resnet18 --batches 64 --modes eager graphed \
        --backends fovi_lab auto cuda baseline torch_compact stubbed --out "$OUT/network.jsonl" > "$OUT/network.log" 2>&1
    fi
    tail -10 "$OUT/network.log"; echo "network done at $(( $(date +%s) - t0 )) s"
    # ResNet-18 with its stem's dx on the tap-expanded layer (records carry settings: {FOVI_KNN_DX_PATH: taps})
    alt=(); [ -f "$fovi_recs" ] && alt=(--alternatives "$fovi_recs")
    FOVI_KNN_DX_PATH=taps timeout "$(cap 50)" python3 -m fovi_lab.bench.network --net resnet18 --batches 64 \
      --modes eager graphed --backends fovi_lab ${alt[@]+"${alt[@]}"} --out "$OUT/network_dx_taps.jsonl" \
      > "$OUT/net_taps.log" 2>&1
    tail -3 "$OUT/net_taps.log"
    timeout "$(cap 20)" python3 tools/gpu/profile_step.py dinov3_patch:16 res18_layer4_0:16 res18_stem:16 \
      > "$OUT/profile.log" 2>&1; tail -2 "$OUT/profile.log"
    [ "$(left)" -gt 30 ] && FOVI_WARP_MATHDX=0 timeout $(( $(left) - 3 )) python3 -m fovi_lab.bench.host \
      --layers res18_layer1 alex_L1 res18_stem --batches 16 --fovi fovi_lab cuda --out "$OUT/host.jsonl" \
      > "$OUT/host.log" 2>&1
    tail -20 "$OUT/host.log" ;;
  finish)
    # the call after steps on the same machine: where fovi_lab's memory goes in both networks, the train step at
    # B = 512, ResNet-18's eager step with fovi's fastest backends in one process, then the in-place job in what is left
    FOVI_TIMEOUT=$(cap 150) bash "$0" memory fovi_lab
    c=$(cap 150); timeout "$c" python3 -m fovi_lab.bench.backward train-step --graphs --no-fovi --batches 512 \
      --layers all --jobs 16 --time-budget-s $(( c - 30 )) --out "$OUT/train_step_b512.jsonl" > "$OUT/ts512.log" 2>&1
    tail -3 "$OUT/ts512.log"; echo "B = 512 done at $(( $(date +%s) - t0 )) s"
    timeout "$(cap 70)" python3 -m fovi_lab.bench.network --net resnet18 --batches 64 --modes eager \
      --backends fovi_lab cuda auto --out "$OUT/network_one_process.jsonl" > "$OUT/net_one.log" 2>&1
    tail -4 "$OUT/net_one.log"
    [ "$(left)" -gt 30 ] && FOVI_TIMEOUT=$(( $(left) - 3 )) bash "$0" in-place ;;     # in what is left
  networks-all)
    for m in 0 1; do
      FOVI_WARP_MATHDX=$m timeout "$(cap 50)" python3 -m fovi_lab.bench.backward train-step --graphs --no-fovi \
        --batches 16 --layers res18_layer1 res18_layer3_0 res18_stem --jobs 16 \
        --out "$OUT/train_step_tile_gemm.jsonl" > "$OUT/tile_gemm_$m.log" 2>&1
      tail -2 "$OUT/tile_gemm_$m.log"
    done
    timeout "$(cap 110)" python3 -m fovi_lab.bench.network --net alexnet --batches 64 --modes eager graphed \
      --backends fovi_lab auto cuda baseline torch_compact stubbed --out "$OUT/network.jsonl" > "$OUT/network_alex.log" 2>&1
    tail -8 "$OUT/network_alex.log"
    timeout "$(cap 170)" python3 -m fovi_lab.bench.network --net resnet18 alexnet --batches 256 --modes eager \
      graphed --backends fovi_lab auto cuda baseline torch_compact stubbed --out "$OUT/network.jsonl" \
      > "$OUT/network_256.log" 2>&1
    tail -12 "$OUT/network_256.log"
    c=$(cap 120); timeout "$c" python3 -m fovi_lab.bench.forward --graphs --no-cached --no-compile --no-fovi \
      --reps 20 --warmup 3 --batches 16 64 --time-budget-s $(( c - 30 )) --tag "$tag" --out "$OUT/forward.jsonl" \
      > "$OUT/forward.log" 2>&1
    tail -3 "$OUT/forward.log"
    [ "$(left)" -gt 50 ] && timeout $(( $(left) - 3 )) python3 -m fovi_lab.bench.backward train-step --graphs \
      --batches 16 --layers alex_L0 alex_L2 alex_L3 alex_L4 res18_layer2_0 res18_layer3 dinov3_patch res18_layer1 \
      alex_L1 res18_layer2 res18_layer3_0 res18_layer4_0 res18_stem --jobs 16 \
      --time-budget-s $(( $(left) - 40 )) --out "$OUT/train_step_fovi.jsonl" > "$OUT/train_step_fovi.log" 2>&1
    tail -6 "$OUT/train_step_fovi.log" ;;
  in-place)
    # the replay modes side by side on one machine: records say which (replay); run after warmup (the steps job)
    FOVI_WARP_MATHDX=0 timeout "$(cap 60)" python3 -m pytest -o addopts="" -p no:cacheprovider -q -s \
      tests/ops/test_gpu_replay.py -k in_place --junitxml="$OUT/in_place_tests.xml" > "$OUT/in_place_tests.log" 2>&1
    tail -8 "$OUT/in_place_tests.log"
    for mode in auto in-place; do
      FOVI_KNN_REPLAY=$mode timeout "$(cap 120)" python3 -m fovi_lab.bench.backward train-step --no-fovi \
        --batches 16 64 --layers all --jobs 16 --out "$OUT/train_step_replay_modes.jsonl" > "$OUT/ts_$mode.log" 2>&1
      tail -2 "$OUT/ts_$mode.log"
      FOVI_KNN_REPLAY=$mode timeout "$(cap 40)" python3 -m fovi_lab.bench.host --layers res18_layer1 alex_L1 \
        dinov3_patch --batches 16 --backends warp_train --paths step --out "$OUT/host_replay_modes.jsonl" \
        > "$OUT/host_$mode.log" 2>&1; tail -4 "$OUT/host_$mode.log"
      FOVI_KNN_REPLAY=$mode timeout "$(cap 60)" python3 -m fovi_lab.bench.network --net resnet18 --batches 64 \
        --modes eager --backends fovi_lab stubbed --out "$OUT/network_replay_modes.jsonl" > "$OUT/net_$mode.log" 2>&1
      tail -3 "$OUT/net_$mode.log"
    done ;;
  ddp)
    # two GPUs of one host: data-parallel training (warp_train and torch_compact; batch norm synchronised, then group
    # norm for warp_train), ops on cuda:1 while cuda:0 is current, the autotune cache under DDP
    # (the digits network's kernels compile in the first run, before its timed steps; the later runs find them)
    timeout "$(cap 240)" python3 -m fovi_lab.bench.ddp --nproc 2 --per-device-batch 64 --steps 120 --timeout-s 50 \
      --out "$OUT/ddp.jsonl" > "$OUT/ddp.log" 2>&1; tail -4 "$OUT/ddp.log"
    timeout "$(cap 120)" python3 -m fovi_lab.bench.ddp --nproc 2 --per-device-batch 64 --steps 120 --norm group \
      --timeout-s 28 --backends warp_train --out "$OUT/ddp.jsonl" > "$OUT/ddp_group.log" 2>&1; tail -2 "$OUT/ddp_group.log"
    timeout "$(cap 100)" python3 -m pytest -o addopts="" -p no:cacheprovider -q tests/bench/test_gpu_ddp.py \
      tests/ops/test_gpu_torch_native.py --junitxml="$OUT/ddp_tests.xml" > "$OUT/ddp_tests.log" 2>&1
    tail -4 "$OUT/ddp_tests.log" ;;
  ncu)
    timeout "$limit" ncu --nvtx --nvtx-include "profile/" -k regex:fovi_fwd --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
      --metrics l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      --csv --page details python3 tools/gpu/ncu_targets.py "$@" > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
    tail -3 "$OUT/ncu.err" ;;
  notebooks)
    bash tools/gpu/run_notebooks.sh "$@" ;;
  *)
    echo "unknown job $job" >&2; exit 2 ;;
esac
echo "$job done in $(( $(date +%s) - t0 )) s"
# at most 8 files come back from a call: past that, the logs travel as one archive (records stay files)
if [ -n "${OUT:-}" ] && [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && tar -czf "logs_$job.tgz" --remove-files $(ls | grep -v -e '\.jsonl$' -e '\.tgz$') 2>/dev/null)
  echo "logs packed into logs_$job.tgz: $(find "$OUT" -maxdepth 1 -type f | wc -l) files under \$OUT"
fi
