#!/usr/bin/env bash
# Session 7, run 41: the stems on the final SIMT rule (fp16 sd_b8o8u4 at B <= 16, vec4 sv_* up to B = 64, 128 for Cout <= 64):
# run 37's script with the forward op also at B = 128 (the train step at B = 16/64 with the default picks and,
# on the same lease, with FOVI_WARP_STEM_SIMT=off).
FWD_BATCHES="16 64 128" exec bash "$(dirname "$0")/session7_run37_stems_train_step.sh"
