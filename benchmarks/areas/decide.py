"""What decides (issue 24): direct logit attribution against a traced forward; activation patching against its floor
of batched forwards and against forward hooks on timm."""
from __future__ import annotations

import numpy as np
import torch

from timing import report, same_map, verdict
from workbench import Bench

TARGETS = {"decide": 1.30, "decide-floor": 1.10, "decide-hooks": 1.00}


def timm_patching(reference, clean: torch.Tensor, corrupted: torch.Tensor, target: int, foil: int) -> np.ndarray:
    """Residual patching as one writes it with forward hooks on timm: per block and token, the clean run's
    residual copied into the corrupted run's block input, one position per forward. -> L n normalised effects."""
    def metric(logits):
        return float(logits[0, target] - logits[0, foil])

    inputs = []
    hooks = [block.register_forward_pre_hook(lambda module, args: inputs.append(args[0])) for block in reference.blocks]
    m_clean = metric(reference(clean))
    for hook in hooks:
        hook.remove()
    m_corrupted = metric(reference(corrupted))
    effects = np.zeros((len(reference.blocks), inputs[0].shape[1]))
    for layer, block in enumerate(reference.blocks):
        for j in range(inputs[0].shape[1]):
            def patch(module, args, layer=layer, j=j):
                x = args[0].clone()
                x[:, j] = inputs[layer][:, j]
                return (x,)
            hook = block.register_forward_pre_hook(patch)
            effects[layer, j] = (metric(reference(corrupted)) - m_corrupted) / (m_clean - m_corrupted)
            hook.remove()
    return effects


def direct_attribution(bench: Bench, name: str, model: torch.nn.Module) -> None:
    """One model's line: a trace with the decomposition, direct logit attribution and token effects, against a
    traced forward, batch 1."""
    from vitviz import explain

    pixels = torch.randn(1, 3, 224, 224, device=bench.device)
    with torch.no_grad():
        t = bench.time({"dla": lambda: explain.direct_logit_attribution(model, model.trace(pixels, decompose=True)),
                        "traced": lambda: model.trace(pixels)})
    report(f"decide attribution b1 {name}: trace + direct logit attribution + token effects {t['dla']}, traced "
           f"forward {t['traced']}, " + verdict(t["dla"].median / t["traced"].median, TARGETS["decide"]))


def measure(bench: Bench, items: set[str]) -> None:
    """Direct logit attribution with token effects (ViT-B/16 and CvT-13, batch 1) against a traced forward;
    residual patching of every block and position of ViT-Ti/16 at 112 px (12 x 50 patched images; at 224 px the
    hooks alone take minutes a round on a CPU) against its floor, the same batched forwards from each block on
    without building the patched batches, and against forward hooks on timm's blocks, one position per forward."""
    from vitviz import explain

    for name, (_, loaded) in (("vit_base_patch16_224", bench.vit_base), ("CvT-13", bench.cvt_13)):
        direct_attribution(bench, name, loaded.model)

    size = 112
    reference, loaded = bench.timm_vit("vit_tiny_patch16_224", img_size=size)
    model, batch = loaded.model, 64
    torch.manual_seed(0)
    clean = torch.randn(1, 3, size, size, device=bench.device)
    corrupted = explain.corrupt(clean, "blur", strength=2.0)
    ours = lambda: explain.patch_activations(model, clean, corrupted, site="resid", batch_size=batch)
    result = ours()
    with torch.no_grad():
        run = model.trace(corrupted)
        theirs = lambda: timm_patching(reference, clean, corrupted, result.metric.target, result.metric.foil)
        ours_table = np.stack([torch.cat([p, g.flatten()]).cpu().numpy() for p, g in zip(result.prefix, result.grid)])
        same_map(ours_table, theirs(), "residual patching", tol=1e-4)

        ready = [(index, block.inputs.expand(min(batch, block.tokens.shape[1] - start), -1, -1).contiguous())
                 for index, block in enumerate(run.blocks) for start in range(0, block.tokens.shape[1], batch)]

        def floor():   # the batched forwards patching needs, from each block on, on ready-made batches
            for index, inputs in ready:
                model.forward_from(index, inputs)

        plan = explain.patching_plan(run, site="resid", batch_size=batch)
        t = bench.time({"vitviz": ours, "floor": floor, "timm": theirs})
    report(f"decide patching resid ViT-Ti/16 {size} px, {plan.images} patched images in {plan.forwards} forwards of "
           f"<= {batch}: vitviz {t['vitviz']}, floor {t['floor']}, "
           + verdict(t["vitviz"].median / t["floor"].median, TARGETS["decide-floor"])
           + f"; timm forward hooks one position per forward {t['timm']}, "
           + verdict(t["vitviz"].median / t["timm"].median, TARGETS["decide-hooks"]))
