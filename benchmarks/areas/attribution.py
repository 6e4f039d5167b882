"""The explanation methods against their reference packages on the same ViT-B/16 weights: LeGrad against torchcam,
Grad-CAM against grad-cam, AttnLRP against lxt (issue 14)."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import torch

from timing import Timing, ms, report, same_logits, same_map, verdict
from workbench import ROOT, Bench

TARGET = 1.00


@dataclass
class Duel:
    """One vitviz method and a reference package's implementation of it, timed on the same weights and input."""
    method: str       # the vitviz.explain name
    peer: str         # the reference, as the line names it
    ours: Timing
    theirs: Timing


def legrad_vs_torchcam(bench: Bench, pixels: torch.Tensor, target: int) -> Duel:
    """vitviz's `legrad` over every block against torchcam's `LeGrad` on torchvision's ViT with the same weights."""
    from torchcam.methods import LeGrad

    from torchvision_vit import timm_to_torchvision
    from vitviz.explain import legrad

    reference, loaded = bench.vit_base
    copy = timm_to_torchvision(reference).to(bench.device)
    with LeGrad(copy, list(copy.encoder.layers)) as extractor:
        ours = lambda: legrad(loaded.model, pixels, target)
        theirs = lambda: extractor(target, copy(pixels))[0]
        same_map(ours().cpu().numpy(), theirs().cpu().numpy(), "LeGrad", tol=1e-4)
        t = bench.time({"vitviz": ours, "peer": theirs})
    return Duel("legrad", "torchcam LeGrad on torchvision's ViT", t["vitviz"], t["peer"])


def gradcam_vs_grad_cam(bench: Bench, pixels: torch.Tensor, target: int) -> Duel:
    """vitviz's `gradcam` against grad-cam's `GradCAM` on the timm model (its ViT recipe: the last block's norm1,
    the class token dropped); grad-cam also resizes its map to the input, which vitviz leaves to its views."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.image import scale_cam_image
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from vitviz.explain import gradcam

    reference, loaded = bench.vit_base
    size = tuple(pixels.shape[2:])
    grid = [n // loaded.model.config.patch_size for n in size]

    def reshape_transform(tokens: torch.Tensor) -> torch.Tensor:   # grad-cam's ViT tutorial: b (1 + h w) c -> b c h w
        return tokens[:, 1:].reshape(tokens.shape[0], *grid, tokens.shape[2]).permute(0, 3, 1, 2)

    with GradCAM(reference, [reference.blocks[-1].norm1], reshape_transform=reshape_transform) as cam:
        ours = lambda: gradcam(loaded.model, pixels, target)
        theirs = lambda: cam(pixels, [ClassifierOutputTarget(target)])
        resized = scale_cam_image(scale_cam_image(ours().cpu().numpy(), size[::-1]))   # grad-cam's resize
        same_map(resized, theirs(), "Grad-CAM", tol=1e-4)
        t = bench.time({"vitviz": ours, "peer": theirs})
    return Duel("gradcam", "grad-cam GradCAM on timm", t["vitviz"], t["peer"])


def attnlrp_vs_lxt(bench: Bench, pixels: torch.Tensor, target: int) -> Duel | None:
    """vitviz's `attnlrp` (lxt's ViT defaults: gamma 0.25 on convolutions, 0.05 on linear layers, CP attention)
    against lxt 2.1 + zennit on torchvision's ViT with the same weights. lxt patches torch's classes for the
    whole process, so it runs and times itself in a process of its own (tests/lxt_reference.py), with this
    run's threads, clock and repeats after one untimed pass: the two are not interleaved round by round like
    the other contenders, which `--clock cpu` (each process's own CPU time) makes fair on a busy machine."""
    from safetensors.torch import load_file, save_file

    from torchvision_vit import timm_to_torchvision
    from vitviz.explain import attnlrp

    if bench.device.type != "cpu":
        report(f"attribution attnlrp b1 vit_base_patch16_224: no duel on {bench.device.type} "
               f"(tests/lxt_reference.py runs lxt on the CPU only)")
        return None
    reference, loaded = bench.vit_base
    copy = timm_to_torchvision(reference)
    block = copy.encoder.layers[0]
    job, out = bench.tmp / "lxt-job.safetensors", bench.tmp / "lxt-out.safetensors"
    save_file({**{f"model.{k}": v.contiguous() for k, v in copy.state_dict().items()}, "pixels": pixels.contiguous(),
               "targets": torch.tensor([target]), "gammas": torch.tensor([[0.25, 0.05]]),
               "config": torch.tensor([copy.image_size, copy.patch_size, len(copy.encoder.layers),
                                       block.self_attention.num_heads, copy.hidden_dim, block.mlp[0].out_features,
                                       copy.num_classes]),
               "timing": torch.tensor([bench.repeats, torch.get_num_threads(), int(bench.clock == "cpu")])}, job)
    subprocess.run([sys.executable, str(ROOT / "tests" / "lxt_reference.py"), str(job), str(out)], check=True)
    lxt = load_file(out)
    ours = lambda: attnlrp(loaded.model, pixels, target, pixel_map=True)
    expected = lxt["relevance"][0]
    same_map((ours() / expected.abs().max()).numpy(), (expected / expected.abs().max()).numpy(), "AttnLRP", tol=1e-4)
    t = bench.time({"vitviz": ours})
    return Duel("attnlrp", "lxt AttnLRP on torchvision's ViT", t["vitviz"], Timing(lxt["seconds"][0].tolist()))


# each (bench, pixels, target class) -> Duel (None: none on this device); one that must not share this process
# (lxt patches torch classes process-wide) times its reference in a subprocess of its own and returns that Timing
DUELS = (legrad_vs_torchcam, gradcam_vs_grad_cam, attnlrp_vs_lxt)


def measure(bench: Bench, items: set[str]) -> None:
    """Each method against its reference on ViT-B/16 (random weights), batch 1, fp32 (grad-cam reads its maps
    through numpy, which has no bf16), with gradients; also each one's time in vitviz forwards."""
    reference, loaded = bench.vit_base
    pixels = torch.randn(1, 3, 224, 224, device=bench.device)
    with torch.inference_mode():
        same_logits(loaded.model(pixels), reference(pixels), "ViT-B/16")
        target = int(loaded.model(pixels).argmax())
        forward = bench.time({"forward": lambda: loaded.model(pixels)})["forward"]
    in_forwards = lambda t: f"{t} = {t.median / forward.median:.1f} forwards"
    for duel in DUELS:
        if (d := duel(bench, pixels, target)) is None:
            continue
        report(f"attribution {d.method} b1 vit_base_patch16_224: vitviz {in_forwards(d.ours)}, {d.peer} "
               f"{in_forwards(d.theirs)} (vitviz forward {ms(forward.median)} ms), "
               + verdict(d.ours.median / d.theirs.median, TARGET))
