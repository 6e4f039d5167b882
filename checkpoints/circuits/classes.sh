#!/usr/bin/env bash
# The bundled pair's class circuits (issue 55; model card: checkpoints/README.md, "Class circuits"): for every
# CIFAR-10 class, each model's circuit of that class over 100 of its test images (the logit minus the mean logit,
# its default dictionaries: three depths, the dictionary across both, the last block), F with its 95 % interval.
# class-circuit-<model>-<class>.json here. Run from the repository root; `torchrun --nproc_per_node=N -m vitviz`
# in place of `python -m vitviz` splits the images over N processes and writes the same files.
set -euo pipefail
DATA=${DATA:-cifar10}
OUT=${OUT:-checkpoints/circuits}
LIMIT=${LIMIT:-100}
for class in airplane automobile bird cat deer dog frog horse ship truck; do
  python -m vitviz circuits --models vit-cifar10 cvt-cifar10 --data "$DATA" --split test --class "$class" \
    --limit "$LIMIT" --out "$OUT"
done
