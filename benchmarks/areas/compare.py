"""Comparing architectures (issue 23): CKA of every layer pair against the traced forwards it needs, and against
pytorch-cka's hook-based pass."""
from __future__ import annotations

import numpy as np
import torch

import vitviz
from timing import report, verdict
from workbench import Bench, photos

TARGETS = {"compare": 1.20, "compare-cka": 1.00}


def timm_vision_transformer(model) -> torch.nn.Module:
    """timm's `VisionTransformer` holding a vitviz ViT's weights (timm's names, so they load 1:1, strictly)."""
    from timm.models.vision_transformer import VisionTransformer

    c = model.config
    reference = VisionTransformer(img_size=c.img_size, patch_size=c.patch_size, in_chans=c.in_chans,
                                  num_classes=c.num_classes, embed_dim=c.embed_dim, depth=c.depth,
                                  num_heads=c.num_heads, mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias,
                                  class_token=c.class_token, reg_tokens=c.reg_tokens, no_embed_class=c.no_embed_class,
                                  global_pool=c.global_pool, fc_norm=c.fc_norm, init_values=c.init_values)
    reference.load_state_dict(model.state_dict())
    return reference.eval()


def measure(bench: Bench, items: set[str]) -> None:
    """`vitviz.compare` over 256 images of the bundled pair in batches of 64 (from PIL images: each model's
    preprocessing, traced forward without attention maps, block features, HSIC_1 sums) against those traced
    forwards alone on the same batches (tokens=mean, the default); and with tokens=flat, from the same pixels,
    against pytorch-cka 1.1.3's `compute_cka`: forward hooks on the blocks of timm's `VisionTransformer` holding the
    bundled ViT's weights, and of the bundled CvT (timm has no CvT). Not our ViT's plain forward: that computes
    only the class token in its last block, so hooked there pytorch-cka would measure that block on one token of
    65 and do less work than the comparison needs. Every row is checked equal before the timing."""
    from cka import compute_cka

    from vitviz import compare

    vit, cvt, what = bench.bundled_pair
    loaded = [vitviz.load(name, device=bench.device) for name in (vit, cvt)]
    count, size = (32, 16) if bench.quick else (256, 64)
    images = photos(count, (32, 32))
    cut = compare.batches(range(count), size)
    pixels = [[torch.cat([m.preprocess(images[i]) for i in batch]) for m in loaded] for batch in cut]

    def traced():
        with torch.inference_mode():
            for batch in pixels:
                for m, p in zip(loaded, batch):
                    m.model.trace(p, attention=False)

    def ours_flat():
        acc = compare.LayerCKA()
        with torch.inference_mode():
            for a, b in pixels:
                acc.add_traces(loaded[0].model.trace(a, attention=False), loaded[1].model.trace(b, attention=False),
                               tokens="flat")
        return acc.result()

    layers = [[f"blocks.{i}" for i in range(len(loaded[0].model.blocks))],
              [f"stages.{s}.blocks.{j}" for s, stage in enumerate(loaded[1].model.stages)
               for j in range(len(stage.blocks))]]

    timm_vit = timm_vision_transformer(loaded[0].model).to(bench.device)

    def theirs():
        return compute_cka(timm_vit, loaded[1].model, [[a for a, _ in pixels]], layers=layers[0],
                           model2_layers=layers[1], device=bench.device, progress=False)[0]

    if not all(torch.equal(a, b) for a, b in pixels):
        raise SystemExit("compare: the bundled pair's preprocessing differs; pytorch-cka feeds both models one input")
    ours, reference = np.clip(ours_flat().a_vs_b, 0, 1), theirs().double().cpu().numpy()
    if not np.abs(ours - reference).max() <= 1e-3:
        raise SystemExit(f"compare: vitviz and pytorch-cka disagree (max {np.abs(ours - reference).max():.3g}): "
                         "not timed")
    t = bench.time({"compare": lambda: compare.cka_of_images(loaded, images, tokens="mean", batch_size=size),
                    "traced": traced})
    report(f"compare {count} images, {what}, tokens=mean: vitviz {t['compare']}, its traced forwards {t['traced']}, "
           + verdict(t["compare"].median / t["traced"].median, TARGETS["compare"]))
    t = bench.time({"vitviz": ours_flat, "pytorch-cka": theirs})
    report(f"compare {count} images, {what}, tokens=flat: vitviz {t['vitviz']}, pytorch-cka compute_cka on timm's "
           f"ViT and vitviz's CvT {t['pytorch-cka']}, "
           + verdict(t["vitviz"].median / t["pytorch-cka"].median, TARGETS["compare-cka"]))
