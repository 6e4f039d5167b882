#!/usr/bin/env bash
# The bundled dictionaries at several depths a circuit reads (issue 49; model card: checkpoints/README.md), beside
# the last-block ones train.sh makes: three blocks spread over each CIFAR-10 model's depth, one pass over the data
# for the three (`concepts train --block A B C` caches every block from the same traces), one dictionary per block
# in <model>-depths/block<N>. Blocks whose output the next block reads directly (`analysis/splice.py`), and the class
# token read with the grid wherever the block has one (a circuit follows it to the classifier). Run from the
# repository root after train.sh (or alone: it reads the same data).
set -euo pipefail
DATA=${DATA:-cifar10}
OUT=${OUT:-checkpoints/concepts}
THUMBNAILS="$OUT/thumbnails-cifar10.safetensors"   # one store of the thumbnails every bundled index shares
train() { python -m vitviz concepts train --data "$DATA" --kind topk --k 16 --expansion 4 --steps 600 --warmup 60 "$@"; }
train --models vit-cifar10 --block 1 3 5 --tokens patch+cls --limit 20000 --out "$OUT/vit-cifar10-depths"
train --models cvt-cifar10 --block 1 3 5 --tokens patch patch+cls patch+cls --limit 20000 --out "$OUT/cvt-cifar10-depths"
train --models swin-cifar10 --block 0 2 6 --limit 20000 --out "$OUT/swin-cifar10-depths"
train --models resnet-cifar10 --block 1 3 4 --limit 5000 --out "$OUT/resnet-cifar10-depths"
for model in vit cvt swin resnet; do
  for folder in "$OUT/$model-cifar10-depths"/block*; do
    python -m vitviz concepts exemplars "$folder" --data "$DATA" --split test --limit 1000 --top 5 \
      --jpeg-quality 60 --thumbnails "$THUMBNAILS"
    python -m vitviz concepts evaluate "$folder" --data "$DATA" --split test --limit 2000
  done
done
# one dictionary across the bundled pair a block before their last (the ViT's and the CvT's classifiers read their
# class tokens alone, so a dictionary of their last blocks' grids cannot move the answer; here the grids feed it):
# the same concept ids in both models' circuits
python -m vitviz concepts train --data "$DATA" --kind topk --k 16 --expansion 4 --epochs 10 --warmup 60 --limit 20000 \
  --models vit-cifar10 cvt-cifar10 --block 5 7 --out "$OUT/across-vit-cvt-cifar10"
python -m vitviz concepts exemplars "$OUT/across-vit-cvt-cifar10" --data "$DATA" --split test --limit 1000 --top 5 \
  --jpeg-quality 60 --thumbnails "$THUMBNAILS"
python -m vitviz concepts evaluate "$OUT/across-vit-cvt-cifar10" --data "$DATA" --split test --limit 2000
