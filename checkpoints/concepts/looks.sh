#!/usr/bin/env bash
# Every bundled concept's picture (the app's concept cards), drawn by vitviz's own CLI with the settings of
# vitviz/looks/pictures.py (MACO on a 32 px canvas, 32 steps of 2 crops, seed 0, on the CPU) and written beside each
# dictionary as looks.safetensors (model card: checkpoints/README.md, "Feature pictures"). Run from the repository
# root: `checkpoints/concepts/looks.sh` draws every bundled dictionary (vitviz.catalog.BUNDLED_DICTIONARIES, in its
# order) that has no pictures yet, `REDRAW=1` all of them again, and named folders (`looks.sh across-cifar10
# vit-cifar10-depths/block1`) just those. One command a dictionary, so an interrupted run keeps those it finished;
# two runs over different folders share a 2-core machine well. A dictionary across models also gets its table of how
# each model's picture excites each concept in every model (`--alike`, 500 CIFAR-10 test photos, under a minute).
set -euo pipefail
OUT=${OUT:-checkpoints/concepts}
# one thread unless told otherwise: on the shared 2-core machine these were drawn on, a second intra-op thread mostly
# spin-waited for a busy core (a ViT step took 1.7 times as long with two); the pictures are the same either way
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
FOLDERS=("$@")
if [ ${#FOLDERS[@]} -eq 0 ]; then
  mapfile -t FOLDERS < <(python -c "from vitviz import catalog
for entry in catalog.BUNDLED_DICTIONARIES.values():
    print(entry.folder or entry.name)")
  if [ "${REDRAW:-0}" != 1 ]; then
    missing=()
    for folder in "${FOLDERS[@]}"; do
      [ -f "$OUT/$folder/looks.safetensors" ] || missing+=("$folder")
    done
    FOLDERS=("${missing[@]}")
    [ ${#FOLDERS[@]} -gt 0 ] || echo "Every bundled dictionary has its pictures (REDRAW=1 draws them all again)."
  fi
fi
for folder in "${FOLDERS[@]}"; do
  python -m vitviz looks --concepts "$OUT/$folder" --pictures --device cpu
  # a dictionary across models: every concept's table of how each model's picture excites it in every model
  if [ -f "$OUT/$folder/across.json" ]; then
    python -m vitviz looks --concepts "$OUT/$folder" --alike --device cpu
  fi
done
