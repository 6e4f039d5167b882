"""lxt 2.1's AttnLRP on torchvision's ViT, as its own example computes it, for the tests and the benchmark.

    python tests/lxt_reference.py JOB.safetensors OUT.safetensors

JOB holds a torchvision `VisionTransformer` state dict (keys `model.*`), `pixels` (b 3 s s), `targets`
(b), `gammas` (k 2: conv, linear) and `config` (image size, patch, layers, heads, hidden, mlp,
classes); for the benchmark also `timing` (repeats, threads, 1 for this process's CPU time or 0 for
wall time). OUT gets `relevance` (k b s s: the pixel map for each gamma pair) and `logits` (b classes),
plus `seconds` (k repeats: the forward + backward time of each pair, after one untimed pass).

lxt patches torch's classes for the whole process (`monkey_patch(vision_transformer)` replaces
nn.LayerNorm's, nn.GELU's and nn.MultiheadAttention's forward), so it runs here, in a process of its
own. Its 2.1 import loads its BERT support, which needs transformers' attention-mask helpers that
transformers 5 removed; this script never uses BERT, so an empty stand-in for lxt's BERT module is
registered before the import.
"""
import sys
import time
import types

import torch
from safetensors.torch import load_file, save_file

bert = types.ModuleType("lxt.efficient.models.bert")   # the stand-in: lxt's default patch map names these two
bert.modeling_bert, bert.attnLRP = types.ModuleType("modeling_bert"), {}
sys.modules["lxt.efficient.models.bert"] = bert

import zennit.rules as z_rules  # noqa: E402
from lxt.efficient import monkey_patch, monkey_patch_zennit  # noqa: E402
from torchvision.models import vision_transformer  # noqa: E402
from zennit.composites import LayerMapComposite  # noqa: E402


def main(job_path: str, out_path: str) -> None:
    monkey_patch(vision_transformer)
    monkey_patch_zennit()
    job = load_file(job_path)
    size, patch, layers, heads, hidden, mlp, classes = job["config"].tolist()
    model = vision_transformer.VisionTransformer(image_size=size, patch_size=patch, num_layers=layers,
                                                 num_heads=heads, hidden_dim=hidden, mlp_dim=mlp,
                                                 num_classes=classes)
    model.load_state_dict({k.removeprefix("model."): v for k, v in job.items() if k.startswith("model.")})
    model.eval()
    for param in model.parameters():   # as lxt's example: gradients for the input only
        param.requires_grad = False
    pixels, targets = job["pixels"], job["targets"].long()
    repeats, threads, cpu_clock = job["timing"].tolist() if "timing" in job else (1, torch.get_num_threads(), 0)
    torch.set_num_threads(threads)
    clock = time.process_time if cpu_clock else time.perf_counter
    maps, seconds, logits = [], [], None
    for conv_gamma, lin_gamma in job["gammas"].tolist():
        composite = LayerMapComposite([(torch.nn.Conv2d, z_rules.Gamma(conv_gamma)),
                                       (torch.nn.Linear, z_rules.Gamma(lin_gamma))])
        composite.register(model)
        times = []
        for _ in range(1 + repeats * ("timing" in job)):
            x = pixels.clone().requires_grad_(True)
            start = clock()
            logits = model(x)
            logits.gather(1, targets[:, None]).sum().backward()
            times.append(clock() - start)
        seconds.append(times[-repeats:])
        composite.remove()
        maps.append((x * x.grad).sum(1).detach())
    save_file({"relevance": torch.stack(maps).contiguous(), "logits": logits.detach().contiguous(),
               "seconds": torch.tensor(seconds, dtype=torch.float64)}, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
