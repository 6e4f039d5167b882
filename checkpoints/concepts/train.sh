#!/usr/bin/env bash
# The bundled concept dictionaries, made by vitviz's own CLI on CIFAR-10's training split (model card:
# checkpoints/README.md, "Concept dictionaries"). Run from the repository root; the activation cache goes to
# runs/activations and is shared by the commands that read the same layer (the across dictionary reads the four
# last-block caches the single ones made).
set -euo pipefail
DATA=${DATA:-cifar10}   # cifar10_jpeg.npz where vitviz finds it (../shared/data/ here; vitviz data cifar10 makes it)
OUT=${OUT:-checkpoints/concepts}
THUMBNAILS="$OUT/thumbnails-cifar10.safetensors"   # one store of the thumbnails every bundled index shares
# --warmup 100: the warm-up they were trained with (the command's default is now a tenth of the run)
train() { python -m vitviz concepts train --data "$DATA" --limit 20000 --kind topk --k 16 --expansion 4 --warmup 100 "$@"; }
# the ViT's and the CvT's classifiers read the last block's class token alone: with it in the dictionary, removing a
# concept moves the prediction (a dictionary of the patch tokens alone could not change it)
train --models vit-cifar10 --block -1 --tokens patch+cls --epochs 2 --out "$OUT/vit-cifar10-last"
train --models cvt-cifar10 --block -1 --tokens patch+cls --epochs 5 --out "$OUT/cvt-cifar10-last"
train --models swin-cifar10 --block -1 --epochs 5 --out "$OUT/swin-cifar10-last"
train --models resnet-cifar10 --block -1 --epochs 2 --out "$OUT/resnet-cifar10-last"
train --models vit-cifar10 --block 3 --epochs 2 --out "$OUT/vit-cifar10-middle"
# one dictionary across the four families, on the 4 x 4 cells they share (their grid tokens: the Swin and ResNet
# caches above, and the ViT's and CvT's patch tokens without their class tokens)
train --models vit-cifar10 cvt-cifar10 swin-cifar10 resnet-cifar10 --block -1 --epochs 20 --out "$OUT/across-cifar10"
# the exemplar indexes the Concepts tab shows: each concept's top 5 of 1,000 test images, with its maps (thumbnails
# at JPEG quality 60, each image's once in the store the bundled indexes share)
for folder in vit-cifar10-last vit-cifar10-middle cvt-cifar10-last swin-cifar10-last resnet-cifar10-last across-cifar10; do
  python -m vitviz concepts exemplars "$OUT/$folder" --data "$DATA" --split test --limit 1000 --top 5 --jpeg-quality 60 \
    --thumbnails "$THUMBNAILS"
done
# held-out metrics (metrics.json in each folder) and the matched pairs of the bundled pair's two dictionaries
for folder in vit-cifar10-last vit-cifar10-middle cvt-cifar10-last swin-cifar10-last resnet-cifar10-last across-cifar10; do
  python -m vitviz concepts evaluate "$OUT/$folder" --data "$DATA" --split test --limit 2000
done
python -m vitviz concepts match "$OUT/vit-cifar10-last" "$OUT/cvt-cifar10-last" --data "$DATA" --split test \
  --limit 1000 --out "$OUT/match-vit-cifar10-last-cvt-cifar10-last"
python checkpoints/concepts/figure.py   # the README's two figures of what the four-way dictionary finds
bash checkpoints/concepts/depths.sh   # the dictionaries at several depths the circuits read
