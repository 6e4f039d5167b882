"""CLIP (issue 25): image and text features against open_clip's, LeGrad-CLIP against legrad_torch's algorithm."""
from __future__ import annotations

import torch

import vitviz
from timing import report, same_logits, same_map, verdict
from workbench import Bench

TARGETS = {"clip": 1.00, "clip-legrad": 0.97}


def measure(bench: Bench, items: set[str]) -> None:
    """CLIP ViT-B/16 with QuickGELU (OpenAI's shape; random weights in open_clip's Hub layout, through
    `vitviz.load`): image features against open_clip 3.3's `encode_image`, text features of 8 prompts against
    `encode_text`, and LeGrad-CLIP (3 prompts, one image, the last two blocks) against legrad_torch 1.1's
    `compute_legrad_clip` as tests/test_clip.py writes it out on open_clip's modules, with its hooks and frozen
    early blocks (legrad_torch itself needs open_clip <= 2.23, which cannot share this venv)."""
    import copy

    import open_clip
    import torch.nn.functional as F

    from test_clip import (
        TINY_NAMES,
        Hooked,
        legrad_torch_compute_legrad_clip,
        min_max,
        register_tiny_clips,
        save_open_clip,
    )
    from test_models import VIT_STD, perturb_
    from vitviz import explain

    shape = "ViT-B-16-quickgelu"   # the lines name it; --quick runs a tiny CLIP of the same kind
    if bench.quick:
        register_tiny_clips(bench.folder("open-clip-configs"))
    config = TINY_NAMES["quick_gelu"] if bench.quick else shape
    torch.manual_seed(0)
    reference = perturb_(open_clip.create_model(config, pretrained=None), std=VIT_STD)
    loaded = vitviz.load(str(save_open_clip(reference, config, bench.folder(config), timm_config=False)),
                         device=bench.device)
    reference = reference.to(bench.device)
    size = loaded.size
    for batch in bench.batches:
        pixels = torch.randn(batch, 3, size, size, device=bench.device)
        with torch.inference_mode():
            same_logits(loaded.image_features(pixels), reference.encode_image(pixels), f"{shape} image features")
            with bench.amp():
                t = bench.time({"vitviz": lambda pixels=pixels: loaded.image_features(pixels),
                                "open_clip": lambda pixels=pixels: reference.encode_image(pixels)})
        report(f"clip image features b{batch} {shape}: vitviz {t['vitviz']}, open_clip encode_image {t['open_clip']}, "
               + verdict(t["vitviz"].median / t["open_clip"].median, TARGETS["clip"]))
    prompts = [f"a photo of a {word}" for word in ("dog", "cat", "ball", "grass", "tree", "car", "sky", "person")]
    ids = loaded.tokenize(prompts)
    with torch.inference_mode():
        same_logits(loaded.clip.text_features(ids), reference.encode_text(ids), f"{shape} text features")
        with bench.amp():
            t = bench.time({"vitviz": lambda: loaded.clip.text_features(ids),
                            "open_clip": lambda: reference.encode_text(ids)})
    report(f"clip text features {len(prompts)} prompts {shape}: vitviz {t['vitviz']}, open_clip encode_text "
           f"{t['open_clip']}, " + verdict(t["vitviz"].median / t["open_clip"].median, TARGETS["clip"]))
    classifier, image = loaded.with_prompts(prompts[:3]), torch.randn(1, 3, size, size, device=bench.device)
    with torch.no_grad():
        text_embedding = F.normalize(reference.encode_text(ids[:3]), dim=-1)
    hooked = Hooked(copy.deepcopy(reference), -2)
    params = explain.METHODS["legrad"].params_for(True)
    ours = lambda: explain.legrad(classifier.model, image.repeat(3, 1, 1, 1), [0, 1, 2], **params)
    theirs = lambda: legrad_torch_compute_legrad_clip(hooked, image, text_embedding)
    upsampled = min_max(F.interpolate(ours()[None], scale_factor=loaded.model.config.patch_size, mode="bilinear"))
    same_map(upsampled.cpu().numpy(), theirs().detach().cpu().numpy(), "LeGrad-CLIP", tol=1e-4)
    t = bench.time({"vitviz": ours, "legrad_torch": theirs})
    report(f"clip legrad 1 image x 3 prompts {shape}: vitviz {t['vitviz']}, legrad_torch's algorithm "
           f"{t['legrad_torch']}, " + verdict(t["vitviz"].median / t["legrad_torch"].median, TARGETS["clip-legrad"]))
