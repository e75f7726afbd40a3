#!/usr/bin/env bash
# Session 10, run 62: Nsight Compute on the picks where the rule misses a target (the stems at large batch against
# their dense ceiling, the few-node resnet layers and DINOv3 against PyTorch) and on one dense ceiling: speed of
# light, occupancy, warp stall reasons, memory workload (tools/h200/ncu_targets.py launches each once in an NVTX
# range "profile").
source tools/h200/device_env10.sh
T="res18_stem:512:mmat_o64b32 res18_stem:512:mmat_o64b32:dense res18_layer3:64:mmat_o64b16k64 res18_layer4_0:64:mmasw_o32b16 dinov3_patch:16:mma_o32b8k64 alex_L1:64:mmat_o96b32"
timeout 400 ncu --nvtx --nvtx-include "profile/" -k regex:fovi_fwd --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats \
  --metrics l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
  --csv --page details python3 tools/h200/ncu_targets.py $T > $OUT/ncu_run62.csv 2> $OUT/ncu_run62.err
echo "ncu rc $? at $(( $(date +%s) - t0 )) s"
tail -5 $OUT/ncu_run62.err; wc -l $OUT/ncu_run62.csv
grep -E "Duration|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|hmma|st.sum|ld.sum|Stall Long|Warp Cycles Per Issued" $OUT/ncu_run62.csv | cut -c1-220 | head -80
