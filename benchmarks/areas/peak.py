"""Item 9: the machine's limit: the best matmul rate, and the fraction of it vitviz's ViT-B/16 forward achieves."""
from __future__ import annotations

import torch

from timing import CLOCKS, ms, report, timed
from workbench import Bench


def vit_flops(config, batch: int) -> float:
    """FLOPs (2 per multiply-add) vitviz's ViT forward performs: patchify; per block qkv, q k^T, attn v,
    proj, MLP; the last block for the tokens the head reads only (see `ViT.forward`); the head."""
    d, hidden = config.embed_dim, int(config.embed_dim * config.mlp_ratio)
    grid = (config.img_size[0] // config.patch_size) * (config.img_size[1] // config.patch_size)
    n = grid + len(config.prefix_kinds)
    read = n if config.global_pool == "avg" else 1 + config.dist_token

    def block(queries: int) -> int:
        return n * d * 3 * d + 2 * queries * n * d + queries * d * d + 2 * queries * d * hidden

    patchify = grid * config.in_chans * config.patch_size ** 2 * d
    return 2.0 * batch * (patchify + (config.depth - 1) * block(n) + block(read) + d * config.num_classes)


def measure(bench: Bench, items: set[str]) -> None:
    """The best of many square matmuls on this device, then vitviz's ViT-B/16 forward (the medians `forward` left,
    else timed here) as a fraction of it."""
    sizes = (256, 512) if bench.quick else (4096, 8192) if bench.device.type == "cuda" else (1024, 2048)
    dtype = torch.bfloat16 if bench.autocast else torch.float32
    rates = {}
    for n in sizes:   # the best of many square products: a peak, not a typical speed
        x, y = (torch.randn(n, n, device=bench.device, dtype=dtype) for _ in range(2))
        best = min(timed({"mm": lambda x=x, y=y: torch.mm(x, y)}, repeats=max(bench.repeats, 5) * 3,
                         warmup=bench.warmup, clock=CLOCKS[bench.clock])["mm"].seconds)
        rates[n] = 2 * n ** 3 / best / 1e9
    n, gflops = max(rates.items(), key=lambda item: item[1])
    reference, loaded = bench.vit_base
    parts = []
    for batch in bench.batches:
        seconds = bench.results.get(("forward", "vit_base_patch16_224", batch))
        if seconds is None:
            pixels = torch.randn(batch, 3, 224, 224, device=bench.device)
            with torch.inference_mode(), bench.amp():
                seconds = bench.time({"f": lambda pixels=pixels: loaded.model(pixels)})["f"].median
        work = vit_flops(loaded.model.config, batch) / 1e9
        parts.append(f"b{batch} {work:.1f} GFLOP in {ms(seconds)} ms = {work / seconds:.0f} GFLOP/s, "
                     f"{work / seconds / gflops:.0%} of peak")
    report(f"machine peak {'bf16' if bench.autocast else 'fp32'} matmul {gflops:.0f} GFLOP/s ({n}x{n}, "
           f"{torch.cuda.get_device_name() if bench.device.type == 'cuda' else f'{torch.get_num_threads()} threads'}); "
           f"vitviz vit_base_patch16_224 forward (median): " + "; ".join(parts))
