"""Train vitviz's own ViT, CvT or Swin on CIFAR-10 into a checkpoint folder `vitviz.load` reads.

    python -m vitviz.train --arch vit-cifar --out checkpoints/vit-cifar10    # --data: cifar10_jpeg.npz, found

The usual small-data recipe: random crop with 4 px padding, horizontal flip, label smoothing,
AdamW (or, for the ResNet, SGD with Nesterov momentum, as He et al. train it) with linear warm-up then
cosine decay. Deterministic for a given seed and thread count; every
epoch is logged (`log.jsonl`) and checkpointed (`train_state.pt`), and `--resume` carries on from it
(`--stop-after N` ends a run after epoch N of its schedule, so it can be made in pieces).
`--save-steps 0 50 100 ...` also keeps the model as it was after that many optimiser steps (0: its
initialisation) in `OUT/steps/step-<N>/`, each a checkpoint folder `vitviz.load` reads (`<model>@<N>` for a
bundled model), so a training run can be looked at along the way.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from .bundle import save_bundle, step_folder
from .data import CIFAR10, DataError, open_npz, spread
from .models import (
    FAMILIES,
    CvTConfig,
    CvTStageConfig,
    ResNetConfig,
    SwinConfig,
    ViTConfig,
    family_of_config,
    num_params,
)
from .preprocess import Transform

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def _cvt_cifar(dims, heads, depths) -> CvTConfig:
    # 32x32 input: 3x3 stride-2 embeddings give 16x16, 8x8 and 4x4 token grids
    return CvTConfig(num_classes=10, stages=tuple(
        CvTStageConfig(embed_dim=d, depth=n, num_heads=h, patch_size=3, patch_stride=2, patch_padding=1,
                       cls_token=i == 2) for i, (d, h, n) in enumerate(zip(dims, heads, depths))))


ARCHITECTURES = {
    "vit-cifar": ViTConfig(img_size=(32, 32), patch_size=4, num_classes=10, embed_dim=192, depth=7, num_heads=3,
                           mlp_ratio=2.0),
    "cvt-cifar": _cvt_cifar((64, 128, 192), (1, 2, 3), (1, 2, 6)),
    # patch 2: 16x16, 8x8 and 4x4 token grids; 4x4 windows (stage 3's window is its whole grid, unshifted)
    "swin-cifar": SwinConfig(img_size=(32, 32), patch_size=2, num_classes=10, embed_dim=48, depths=(2, 2, 6),
                             num_heads=(3, 6, 12), window_size=4),
    # He et al.'s CIFAR design (3x3 stem, no max pool, three stages on 32x32, 16x16 and 8x8 grids) as a ResNet-14 at
    # twice ResNet-20's widths (the depth and widths of Zagoruyko and Komodakis' WRN-16-2): ResNet-20 stalls below
    # 88 % in the epochs one CPU session holds (checkpoints/README.md)
    "resnet-cifar": ResNetConfig(block="basic", layers=(2, 2, 2), widths=(32, 64, 128), stem_width=32, stem_kernel=3,
                                 num_classes=10),
    # tiny ones for the test suite
    "vit-micro": ViTConfig(img_size=(32, 32), patch_size=8, num_classes=10, embed_dim=32, depth=2, num_heads=2),
    "cvt-micro": _cvt_cifar((16, 24, 32), (1, 1, 2), (1, 1, 1)),
    "resnet-micro": ResNetConfig(block="basic", layers=(1, 1), widths=(8, 16), stem_width=8, stem_kernel=3,
                                 num_classes=10),
    "swin-micro": SwinConfig(img_size=(32, 32), patch_size=4, num_classes=10, embed_dim=16, depths=(2, 2),
                             num_heads=(1, 2), window_size=4),
}


def load_cifar10(path: str | Path, split: str,
                 limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """-> (uint8 images n 3 32 32, int64 labels n, class names) from the CIFAR-10 JPEG npz (`path`, or 'cifar10':
    the file `vitviz.data.cifar10_file` finds); a limited subset is spread evenly over the file, which is ordered by
    class."""
    data = open_npz(path, split=split)
    if data.labels is None:
        raise DataError(f"{path}: training needs labels, and the file has no {split}_labels")
    picks = spread(len(data), limit)
    images = np.stack([np.asarray(data.image(i)) for i in picks])
    labels = torch.tensor([data.labels[i] for i in picks], dtype=torch.int64)
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), labels, list(data.classes)


def augment(images: torch.Tensor, generator: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Random crop from the zero-padded image and random horizontal flip, per image."""
    n, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad))
    dy, dx = torch.randint(0, 2 * pad + 1, (2, n), generator=generator)
    rows = (dy[:, None] + torch.arange(h))[:, None, :, None].expand(n, 3, h, w + 2 * pad)
    out = padded.gather(2, rows)
    cols = (dx[:, None] + torch.arange(w))[:, None, None, :].expand(n, 3, h, w)
    out = out.gather(3, cols)
    flip = torch.rand(n, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], out.flip(3), out)


def lr_at(step: int, *, total: int, warmup: int, peak: float, floor: float = 1e-5) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


@torch.inference_mode()
def evaluate(model, images, labels, transform: Transform, device, batch_size: int = 500) -> tuple[float, torch.Tensor]:
    """-> (mean loss, predictions)."""
    model.eval()
    losses, preds = [], []
    for i in range(0, len(images), batch_size):
        x = transform.normalize(images[i:i + batch_size].to(device).float() / 255)
        logits = model(x).float()
        losses.append(F.cross_entropy(logits, labels[i:i + batch_size].to(device), reduction="sum").item())
        preds.append(logits.argmax(1).cpu())
    return sum(losses) / len(images), torch.cat(preds)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m vitviz.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=sorted(ARCHITECTURES), required=True)
    p.add_argument("--data", default=CIFAR10, help="the CIFAR-10 JPEG npz (default: cifar10, the file found at "
                                                   "$VITVIZ_CIFAR10, ../shared/data/ beside the repository or "
                                                   "~/.cache/vitviz/; `vitviz data cifar10` makes it)")
    p.add_argument("--out", required=True, help="checkpoint folder to write")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="sgd: Nesterov momentum 0.9")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--clip-grad", type=float, default=1.0, help="gradient norm clipping (0: none)")
    p.add_argument("--channels-last", action="store_true", help="channels-last memory (faster convolutions on a CPU)")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training images")
    p.add_argument("--limit-test", type=int, default=None, help="evaluate on the first N test images")
    p.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    p.add_argument("--stop-after", type=int, default=None, metavar="EPOCH",
                   help="stop after this epoch, its state saved (the schedule still spans --epochs): a run in pieces, "
                        "continued by --resume")
    p.add_argument("--steps-dtype", choices=("int8", "float16"), default="int8",
                   help="how --save-steps stores the kept models (int8: a scale per row, half fp16's bytes)")
    p.add_argument("--save-steps", type=int, nargs="+", default=[], metavar="N",
                   help="also save the model after these optimiser steps (0: as initialised) in OUT/steps/step-N/")
    args = p.parse_args(argv)
    if args.stop_after is not None and not 1 <= args.stop_after <= args.epochs:
        p.error(f"--stop-after is an epoch from 1 to --epochs ({args.epochs}), not {args.stop_after}")
    if any(step < 0 for step in args.save_steps):
        p.error(f"--save-steps are numbers of optimiser steps, 0 or more, not {min(args.save_steps)}")
    return args



def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)

    t0 = time.time()
    train_x, train_y, classes = load_cifar10(args.data, "train", args.limit_train)
    test_x, test_y, _ = load_cifar10(args.data, "test", args.limit_test)
    print(f"data: {len(train_x)} train / {len(test_x)} test images decoded in {time.time() - t0:.1f}s", flush=True)

    config = ARCHITECTURES[args.arch]
    family = family_of_config(config)
    model = FAMILIES[family][0](config).to(device)
    transform = Transform(crop=(32, 32), resize=32, mean=CIFAR_MEAN, std=CIFAR_STD)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                                    weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps_per_epoch = math.ceil(len(train_x) / args.batch_size)
    total, warmup = args.epochs * steps_per_epoch, int(args.warmup_epochs * steps_per_epoch)
    generator = torch.Generator().manual_seed(args.seed)
    start_epoch, elapsed = 0, 0.0
    state_path, log_path = out / "train_state.pt", out / "log.jsonl"
    if args.resume and state_path.is_file():
        state = torch.load(state_path, weights_only=True, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        start_epoch, elapsed = state["epoch"], state["elapsed"]
        print(f"resumed after epoch {start_epoch}", flush=True)
    elif log_path.exists():
        log_path.unlink()
    print(f"{args.arch}: {num_params(model) / 1e6:.2f} M parameters on {device}, "
          f"{torch.get_num_threads()} threads", flush=True)

    use_amp = device.type == "cuda"
    training = {k: v for k, v in vars(args).items() if k not in ("out", "resume", "device", "threads", "save_steps",
                                                                 "steps_dtype", "stop_after")}

    def save_step(step: int) -> None:
        if step in args.save_steps:
            save_bundle(step_folder(out, step), model, transform=transform, labels=classes,
                        dtype=getattr(torch, args.steps_dtype),
                        extra={"training": training, "step": step, "epoch": step / steps_per_epoch})

    if start_epoch == 0:
        save_step(0)
    for epoch in range(start_epoch, args.epochs):
        model.train()
        t_epoch = time.time()
        order = torch.randperm(len(train_x), generator=generator)
        loss_sum, correct = 0.0, 0
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{args.epochs}", unit="batch",
                   file=sys.stderr, mininterval=5)
        for i in bar:
            step = epoch * steps_per_epoch + i
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total=total, warmup=warmup, peak=args.lr)
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            x = transform.normalize(augment(train_x[idx], generator).to(device).float() / 255)
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = train_y[idx].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=args.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.clip_grad:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            optimizer.step()
            save_step(step + 1)
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == y).sum().item()
            bar.set_postfix(loss=f"{loss.item():.3f}",
                            img_s=f"{(i + 1) * args.batch_size / (time.time() - t_epoch):.0f}")
        bar.close()
        test_loss, preds = evaluate(model, test_x, test_y, transform, device)
        elapsed += time.time() - t_epoch
        record = {"epoch": epoch + 1, "train_loss": loss_sum / len(train_x), "train_acc": correct / len(train_x),
                  "test_loss": test_loss, "test_acc": (preds == test_y).float().mean().item(),
                  "lr": optimizer.param_groups[0]["lr"], "epoch_s": round(time.time() - t_epoch, 1)}
        print(json.dumps(record), flush=True)
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state(), "epoch": epoch + 1, "elapsed": elapsed},
                   state_path.with_suffix(".tmp"))
        state_path.with_suffix(".tmp").replace(state_path)
        if args.stop_after == epoch + 1 and epoch + 1 < args.epochs:
            print(f"stopped after epoch {epoch + 1} of {args.epochs}: --resume continues", flush=True)
            return

    _, preds = evaluate(model, test_x, test_y, transform, device)
    per_class = {c: (preds[test_y == k] == k).float().mean().item() for k, c in enumerate(classes)}
    metrics = {"test_acc": (preds == test_y).float().mean().item(), "test_images": len(test_y),
               "per_class_acc": per_class, "train_seconds": round(elapsed), "device": str(device),
               "threads": torch.get_num_threads(), "params": num_params(model)}
    save_bundle(out, model.cpu(), transform=transform, labels=classes,
                extra={"training": training, "metrics": metrics})
    print(json.dumps(metrics), flush=True)


if __name__ == "__main__":
    main()
