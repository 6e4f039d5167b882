#!/usr/bin/env bash
# Every bundled concept's picture (the app's concept cards), drawn by vitviz's own CLI with the settings of
# vitviz/looks/pictures.py (MACO on a 32 px canvas, 32 steps of 2 crops, seed 0, on the CPU) and written beside each
# dictionary as looks.safetensors (model card: checkpoints/README.md, "Feature pictures"). Run from the repository
# root: `checkpoints/concepts/looks.sh` draws every bundled dictionary (vitviz.catalog.BUNDLED_DICTIONARIES, in its
# order) that has no pictures yet or pictures of an older drawing, `REDRAW=1` all of them again, and named
# folders (`looks.sh across-cifar10 vit-cifar10-depths/block1`) just those. One command a dictionary, so an interrupted run keeps those it finished;
# two runs over different folders share a 2-core machine well. A dictionary across models also gets its table of how
# each model's picture excites each concept in every model (`--alike`, 500 CIFAR-10 test photos, under a minute).
set -euo pipefail
OUT=${OUT:-checkpoints/concepts}
# one thread unless told otherwise: on the shared 2-core machine these were drawn on, a second intra-op thread mostly
# spin-waited for a busy core (a ViT step took 1.7 times as long with two); the pictures are the same either way
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
FOLDERS=("$@")
if [ ${#FOLDERS[@]} -eq 0 ]; then
  # every bundled dictionary but those across a training run's checkpoints (ten models' pictures a concept: drawn on
  # request), in the catalog's order; without REDRAW=1 only those whose pictures are missing or were made by an older
  # drawing (`looks.Pictures.current`)
  mapfile -t FOLDERS < <(REDRAW=${REDRAW:-0} python -c "import os
from vitviz import catalog
from vitviz.looks import pictures_of
for entry in catalog.BUNDLED_DICTIONARIES.values():
    if any('@' in model for model in entry.models):   # name@step: a checkpoint of a training run
        continue
    pictures = pictures_of(entry.name)
    if os.environ['REDRAW'] == '1' or pictures is None or not pictures.current:
        print(entry.folder or entry.name)")
  [ ${#FOLDERS[@]} -gt 0 ] || echo "Every bundled dictionary has pictures of this drawing (REDRAW=1 draws them all again)."
fi
for folder in "${FOLDERS[@]}"; do
  python -m vitviz looks --concepts "$OUT/$folder" --pictures --device cpu
  # a dictionary across models: every concept's table of how each model's picture excites it in every model
  if [ -f "$OUT/$folder/across.json" ]; then
    python -m vitviz looks --concepts "$OUT/$folder" --alike --device cpu
  fi
done
