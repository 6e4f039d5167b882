#!/usr/bin/env bash
# Every bundled concept's picture (the app's concept cards), drawn by vitviz's own CLI with the settings of
# vitviz/looks/pictures.py (MACO on a 32 px canvas, 32 steps of 2 crops, seed 0, on the CPU) and written beside each
# dictionary as looks.safetensors (model card: checkpoints/README.md, "Concept dictionaries"). Run from the repository
# root; each dictionary is one command, in the order the app needs them (the bundled pair first, then the dictionary
# across the four models: its shared pictures and each model's own), so an interrupted run keeps those it finished.
set -euo pipefail
OUT=${OUT:-checkpoints/concepts}
# one thread unless told otherwise: on the shared 2-core machine these were drawn on, a second intra-op thread mostly
# spin-waited for a busy core (a ViT step took 1.7 times as long with two); the pictures are the same either way
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
FOLDERS=("$@")
if [ ${#FOLDERS[@]} -eq 0 ]; then
  FOLDERS=(vit-cifar10-last cvt-cifar10-last across-cifar10 vit-cifar10-middle swin-cifar10-last resnet-cifar10-last)
fi
for folder in "${FOLDERS[@]}"; do
  python -m vitviz looks --concepts "$OUT/$folder" --pictures --device cpu
done
