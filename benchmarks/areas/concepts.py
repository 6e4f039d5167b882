"""Concepts (issue 41): caching a layer's activations against the traced forwards alone, training steps against
Overcomplete's training loop on the same tokens, width, k and batch, and what the Concepts tab adds to an Explain."""
from __future__ import annotations

import importlib
import importlib.util
import shutil
import sys
import types
import warnings

import torch

import vitviz
from timing import report
from vitviz import concepts
from vitviz.concepts.activations import cache_activations
from vitviz.data import Dataset
from workbench import PHOTO, Bench, photos

CACHE_TARGET = 0.9   # at least: throughput of caching / throughput of the traced forwards alone
TRAIN_TARGET = 1.0   # at least: vitviz's training steps/s / Overcomplete's
TAB_SECONDS = 0.2    # at most: the Concepts tab on top of an Explain (bundled pair, CPU)
IMAGENET_IMAGES = 1_281_167   # ImageNet-1k's training split
PATCHES = 196                 # ViT-B/16's patch tokens at 224 px (its class token left out)


def at_least(ratio: float, target: float) -> str:
    return f"ratio {ratio:.2f} (target >= {target:.2f}) {'OK' if ratio >= target else 'MISSED'}"


def measure(bench: Bench, items: set[str]) -> None:
    vit = vitviz.load(bench.bundled_pair[0], device=bench.device)
    images = photos(64 if bench.quick else 512, (32, 32))
    data = Dataset(name="bench", ids=tuple(str(i) for i in range(len(images))), labels=None, classes=None,
                   source=images.__getitem__)
    tokens = caching(bench, vit, data)
    training(bench, tokens)
    tab(bench)
    at_scale(bench)


def caching(bench: Bench, vit, data: Dataset) -> torch.Tensor:
    """`cache_activations` of the last block (decoding, preprocessing, traced forwards in batches of 128, shards
    written) into a fresh folder each round, against the same batches' traced forwards alone (decoded and
    preprocessed beforehand)."""
    root = bench.folder("activations")
    pixels = [torch.cat([vit.preprocess(data.image(i)) for i in range(s, min(s + 128, len(data)))])
              for s in range(0, len(data), 128)]

    def cache():
        shutil.rmtree(root, ignore_errors=True)
        return cache_activations(vit, data, block=-1, root=root, progress=False)

    def forwards():
        with torch.inference_mode():
            for batch in pixels:
                vit.model.trace(batch, attention=False)
    t = bench.time({"cache": cache, "forwards": forwards})
    report(f"concepts caching, {len(data)} 32 px images through {vit.name}'s last block: "
           f"{len(data) / t['cache'].median:.0f} images/s ({t['cache']}), the traced forwards alone "
           f"{len(data) / t['forwards'].median:.0f} images/s ({t['forwards']}), "
           + at_least(t["forwards"].median / t["cache"].median, CACHE_TARGET))
    return cache().tokens()


def overcomplete_sae():
    """overcomplete.sae without overcomplete/__init__.py's plotting imports (0.3.0's break on matplotlib >= 3.9)."""
    location = importlib.util.find_spec("overcomplete").submodule_search_locations
    package = types.ModuleType("overcomplete")
    package.__path__ = list(location)
    sys.modules.setdefault("overcomplete", package)
    return importlib.import_module("overcomplete.sae")


def training(bench: Bench, tokens: torch.Tensor) -> None:
    """One epoch of TopK training (k 16, 4x expansion, 4,096 tokens a step, Adam at 4e-4) by `concepts.train`
    (normalisation, AuxK, the decoder's unit rows, progress numbers) against Overcomplete's `train_sae` with its
    TopKSAE and the MSE + AuxK criterion, on the same cached tokens in the same batches."""
    sae = overcomplete_sae()
    from overcomplete.sae.losses import top_k_auxiliary_loss

    d, batch, k = tokens.shape[1], (256 if bench.quick else 4096), 16   # --quick's 64 images hold about 1,000 tokens
    tokens = tokens[: batch * (4 if bench.quick else 24)]
    steps = len(tokens) // batch
    loader = [tokens[i:i + batch] for i in range(0, len(tokens), batch)]

    def ours():
        concepts.train(tokens, kind="topk", k=k, expansion=4, batch_size=batch, progress=False)

    def theirs():
        torch.manual_seed(0)
        model = sae.TopKSAE(d, nb_concepts=4 * d, top_k=k, device=str(bench.device))
        optimizer = torch.optim.Adam(model.parameters(), lr=4e-4)
        sae.train_sae(model, loader, top_k_auxiliary_loss, optimizer, nb_epochs=1, monitoring=0,
                      device=str(bench.device))
    t = bench.time({"vitviz": ours, "overcomplete": theirs})
    report(f"concepts training, {steps} TopK steps of {batch} tokens (d {d}, {4 * d} concepts, k {k}): vitviz "
           f"{steps / t['vitviz'].median:.1f} steps/s ({t['vitviz']}), Overcomplete's train_sae "
           f"{steps / t['overcomplete'].median:.1f} steps/s ({t['overcomplete']}), "
           + at_least(t["overcomplete"].median / t["vitviz"].median, TRAIN_TARGET))


def tab(bench: Bench) -> None:
    """The app's Explain of a photo (`ui.page.explain`: both models traced, the first screen drawn), against the
    same Explain followed by the Concepts tab (`ui.concepts.render_concepts`: `gpu.concepts`, the two columns'
    cards and words), bundled pair with their own bundled dictionaries: the difference is what the tab adds."""
    from vitviz.ui import concepts as concepts_tab, page

    names = vitviz.catalog.BUNDLED_PAIR
    dictionaries = [f"{name}-last" for name in names]
    if bench.quick or not all(d in vitviz.catalog.BUNDLED_DICTIONARIES and
                              vitviz.catalog.BUNDLED_DICTIONARIES[d].path.is_dir() for d in dictionaries):
        report("concepts tab: skipped (needs the bundled pair and its bundled dictionaries; not with --quick)")
        return
    photo = {"path": str(PHOTO)}
    quiet = {"progress": lambda *a, **k: None}

    def explain():
        return page.explain(photo, *names, **quiet)

    def explain_and_concepts():
        return concepts_tab.render_concepts(page.explain(photo, *names, **quiet).key, *dictionaries)
    t = bench.time({"explain": explain, "concepts": explain_and_concepts})
    extra = t["concepts"].median - t["explain"].median
    report(f"concepts tab, bundled pair: Explain {t['explain']}, Explain then the Concepts tab {t['concepts']}: the "
           f"tab adds {extra:.3f} s (target <= {TAB_SECONDS} s) {'OK' if extra <= TAB_SECONDS else 'MISSED'}")


def at_scale(bench: Bench) -> None:
    """What a dictionary of ViT-B/16's block 8 over ImageNet-1k costs, from rates measured here: its traced
    forwards to block 8 (batch 32, 224 px: what caching runs) and TopK training steps at its width (d 768, 8 x:
    6,144 concepts, k 32, 4,096 tokens a step); projected to one pass over ImageNet-1k's 1.28 M images (251 M patch
    tokens), their float32 cache on disk, and the default run's steps (one pass)."""
    if bench.quick:
        report("concepts at ImageNet scale: skipped (measures ViT-B/16 at full size; not with --quick)")
        return
    _, loaded = bench.vit_base
    pixels = torch.randn(32, 3, 224, 224, device=bench.device)
    tokens = torch.randn(3 * 4096, 768)

    def forwards():
        with torch.inference_mode(), bench.amp():
            loaded.model.trace(pixels, attention=False)

    def steps():
        concepts.train(tokens, kind="topk", k=32, expansion=8, batch_size=4096, norm_tokens=4096, progress=False,
                       device=bench.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # random tokens: the poor fit is expected
        t = bench.time({"forwards": forwards, "steps": steps})
    images_per_s, steps_per_s = 32 / t["forwards"].median, 3 / t["steps"].median
    total = IMAGENET_IMAGES * PATCHES
    report(f"concepts at ImageNet scale, ViT-B/16 block 8 on {bench.device.type}: traced forwards (whole model, as "
           f"caching runs them) {images_per_s:.1f} "
           f"images/s (batch 32), TopK training {steps_per_s:.2f} steps/s (d 768, 6144 concepts, k 32, 4096 tokens); "
           f"ImageNet-1k's {IMAGENET_IMAGES / 1e6:.2f} M images = {total / 1e6:.0f} M tokens, "
           f"{total * 768 * 4 / 1e9:.0f} GB cached in float32: caching {IMAGENET_IMAGES / images_per_s / 3600:.1f} h, "
           f"one pass of training ({total // 4096} steps) {total / 4096 / steps_per_s / 3600:.1f} h")
