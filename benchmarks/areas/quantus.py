"""Region perturbation as `vitviz evaluate` runs it against Quantus's `RegionPerturbation` (issue 15)."""
from __future__ import annotations

import numpy as np
import torch

from timing import report, same_map, verdict
from workbench import Bench

TARGET = 1.00


def measure(bench: Bench, items: set[str]) -> None:
    """Region perturbation as `vitviz evaluate` runs it (`faithfulness.region_removal` + `score`) against
    Quantus 0.6's `RegionPerturbation(patch_size=16, order="morf", perturb_baseline="black")`: the same
    model (vitviz's ViT-Ti/16, random weights), images, rollout maps and number of regions."""
    import quantus

    from vitviz.evaluate import Settings
    from vitviz.explain import attention_rollout, faithfulness

    if not hasattr(np, "trapz"):   # quantus 0.6 calls np.trapz, gone in numpy 2
        np.trapz = np.trapezoid
    _, loaded = bench.timm_vit("vit_tiny_patch16_224")
    model, (images, regions) = loaded.model, ((4, 8) if bench.quick else (8, 48))
    pixels = torch.randn(images, 3, 224, 224, device=bench.device)
    with torch.inference_mode():
        target = model(pixels).argmax(dim=-1)
        maps = attention_rollout(model.trace(pixels))
    attributions = torch.nn.functional.interpolate(maps[:, None], size=(224, 224), mode="nearest").cpu().numpy()
    metric = quantus.RegionPerturbation(patch_size=16, order="morf", perturb_baseline="black",
                                        regions_evaluation=regions, disable_warnings=True)
    forward_batch = Settings().on(bench.device).forward_batch   # evaluate's default for the device

    def ours():
        _, perturbation = faithfulness.region_removal(pixels, maps, regions=regions)
        probs = faithfulness.score(model, [perturbation], target, batch_size=forward_batch)[0].probs[0]
        return (probs[:, :1] - probs[:, 1:]).numpy()

    def theirs():
        return np.array(metric(model=model, x_batch=pixels.cpu().numpy(), y_batch=target.cpu().numpy(),
                               a_batch=attributions, device=str(bench.device)))

    same_map(ours(), theirs(), "region perturbation", tol=1e-4)
    t = bench.time({"vitviz": ours, "quantus": theirs})
    report(f"region perturbation {images} images x {regions} regions, ViT-Ti/16 224 px: vitviz {t['vitviz']}, "
           f"quantus RegionPerturbation {t['quantus']}, " + verdict(t["vitviz"].median / t["quantus"].median, TARGET))
