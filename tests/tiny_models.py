"""Small random models of every family for 32 px inputs, five classes, weights moved away from their init (so
attentions are peaked and gradients sizeable): what the tests of family-independent code run on; and random
dictionaries at their blocks, as circuits' sites."""
from types import SimpleNamespace

import torch
from torch import nn

FAMILIES = ("vit", "cvt", "swin", "resnet", "convnext")


def tiny(family: str, *, seed: int = 0) -> nn.Module:
    """A random-weight model of `family`, in eval mode."""
    from vitviz.models import (
        ConvNeXt,
        ConvNeXtConfig,
        CvT,
        CvTConfig,
        CvTStageConfig,
        ResNet,
        ResNetConfig,
        Swin,
        SwinConfig,
        ViT,
        ViTConfig,
    )

    torch.manual_seed(seed)
    if family == "vit":
        model = ViT(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=3, num_heads=2, num_classes=5))
    elif family == "cvt":   # 16 x 16, 8 x 8 and 4 x 4 grids, a class token in the last stage
        stages = tuple(CvTStageConfig(embed_dim=d, depth=n, num_heads=h, patch_size=3, patch_stride=2,
                                      patch_padding=1, cls_token=i == 2)
                       for i, (d, h, n) in enumerate(zip((8, 16, 16), (1, 2, 2), (1, 2, 2))))
        model = CvT(CvTConfig(stages=stages, num_classes=5))
    elif family == "swin":   # a 16 x 16 grid in 4 x 4 windows, shifted every second block, then an 8 x 8 one
        model = Swin(SwinConfig(img_size=(32, 32), patch_size=2, embed_dim=8, depths=(2, 2), num_heads=(1, 2),
                                window_size=4, num_classes=5))
    elif family == "resnet":
        model = ResNet(ResNetConfig(block="basic", layers=(2, 2), widths=(8, 16), stem_width=8, stem_kernel=3,
                                    num_classes=5))
    else:
        model = ConvNeXt(ConvNeXtConfig(depths=(1, 1, 2), dims=(8, 16, 24), num_classes=5))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def random_topk(activations: torch.Tensor, *, model: str, block: int, tokens: str, seed: int):
    """Random directions over the normalisation of `activations` (t d), as training fits it: its zero code decodes
    to their mean, not to the zero vector (which a LayerNorm after the block could not tell apart from any small
    one: a path from it would be all jump)."""
    from vitviz.concepts.kinds.dictionary import Origin
    from vitviz.concepts.kinds.topk import TopK

    d = activations.shape[-1]
    g = torch.Generator().manual_seed(seed)
    dictionary = TopK(d, 4 * d, k=4, origin=Origin(model=model, block=block, tokens=tokens))
    dictionary.normalisation.fit(activations)
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.randn(d, 4 * d, generator=g) / d ** 0.5)
        dictionary.W_dec.copy_(torch.nn.functional.normalize(torch.randn(4 * d, d, generator=g), dim=1))
    return dictionary


def tiny_sites(model: nn.Module, *, blocks: list[int], patches_only: bool = False):
    """(a loaded-model stand-in for `model`, a random photo, a circuit's sites at `blocks` (-1: the last): a random
    TopK dictionary each, over every token the block has, or with `patches_only` its patches alone (a class token
    then passes the sites by))."""
    from vitviz.circuits import sites_of
    from vitviz.concepts.activations.cache import block_tokens

    family = type(model).__name__.lower()
    loaded = SimpleNamespace(model=model, name=f"tiny-{family}", labels=[str(i) for i in range(5)],
                             device=torch.device("cpu"), source=SimpleNamespace(location="tiny"))
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    trace = model.trace(pixels, attention=False)
    dictionaries = []
    for i, block in enumerate(block % len(trace.blocks) for block in blocks):
        out = trace.blocks[block]
        tokens = "position" if not out.attends else \
            ("patch+cls" if "cls" in out.prefix_kinds and not patches_only else "patch")
        activations = block_tokens(trace, block, tokens).detach().flatten(0, 1)
        dictionaries.append((f"{family}-{block}", random_topk(activations, model=loaded.name, block=block,
                                                            tokens=tokens, seed=i)))
    return loaded, pixels, sites_of(loaded, trace, dictionaries)
