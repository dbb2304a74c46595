#!/usr/bin/env bash
# Chapter 5's core grid at 20 seeds on one GPU: tools/gpu_job.sh masking (see there), kept for its callers.
#
#   bash tools/gpu_masking_job.sh OUT_DIR [EXTRA CLI ARGUMENTS...]
#
# writes OUT_DIR/masking_gpu.csv and OUT_DIR/masking_gpu.json; merge them back with
#   python -m attnbook.store merge OUT_DIR/masking_gpu.csv results/masking_full.csv
set -euo pipefail
exec bash "$(dirname "$0")/gpu_job.sh" masking "${1:?usage: tools/gpu_masking_job.sh OUT_DIR [EXTRA CLI ARGUMENTS...]}" \
    "${@:2}"
