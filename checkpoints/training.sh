#!/usr/bin/env bash
# The bundled ViT's and CvT's training runs as checkpoints (issue 59; model card: checkpoints/README.md, "Training
# runs"). Each model is trained again with its bundled recipe, seed and threads, keeping the model after the steps in
# KEEP (int8, `--save-steps`); the kept steps are copied in as checkpoints/<model>/steps/step-<N>/ (`<model>@<N>`);
# `vitviz training` measures each run (steps/training-<model>.json, what the app's Training tab draws); then one
# dictionary across each run says when each of its concepts is born. Run from the repository root; each run
# takes one to two hours on one thread, and `--stop-after E` / `--resume` make it in pieces.
set -euo pipefail
DATA=${DATA:-cifar10}
RUNS=${RUNS:-runs}
KEEP="0 50 100 200 391 782 1564 2737 3910 4692"   # 391 steps an epoch: four points in the first, then epochs 2 to 12
train() { python -m vitviz.train --data "$DATA" --epochs 12 --save-steps $KEEP "$@"; }
train --arch cvt-cifar --out "$RUNS/cvt-cifar10" --threads 1
# the ViT as it was bundled: one thread for ten epochs, then the last two on two threads
train --arch vit-cifar --out "$RUNS/vit-cifar10" --threads 1 --stop-after 10
train --arch vit-cifar --out "$RUNS/vit-cifar10" --threads 2 --resume
for model in cvt-cifar10 vit-cifar10; do
  rm -rf "checkpoints/$model/steps" && mkdir -p "checkpoints/$model/steps"
  cp -r "$RUNS/$model/steps/"step-* "checkpoints/$model/steps/"
  python -m vitviz training --models "$model" --data "$DATA" --limit 500 --out "$RUNS/training"
  cp "$RUNS/training/training-$model.json" "checkpoints/$model/steps/"
done
# one dictionary across each run (catalog.RUN_DICTIONARY_STEPS), its held-out births and exemplars
for model in cvt-cifar10 vit-cifar10; do
  OUT="checkpoints/concepts/$model-training"
  python -m vitviz concepts train --models $(for step in $KEEP; do printf '%s@%s ' "$model" "$step"; done) --block -1 \
    --data "$DATA" --limit 5000 --kind topk --k 16 --expansion 2 --epochs 20 --warmup 40 --out "$OUT"
  python -m vitviz concepts evaluate "$OUT" --data "$DATA" --split test --limit 1000
  python -m vitviz concepts exemplars "$OUT" --data "$DATA" --split test --limit 500 --top 5 --jpeg-quality 60 \
    --thumbnails checkpoints/concepts/thumbnails-cifar10.safetensors
done
