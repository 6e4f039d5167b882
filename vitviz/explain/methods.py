"""The map methods by their public names, in one place: what each computes, what it costs, where it
comes from, and the batched function that computes it.

    explain.METHODS["chefer"].maps(model, pixels, target)    # b gh gw on the model's last token grid

Every name here is what `--methods`, `ModelRun.token_map`, the export's file names and the app's
menus accept. `params` names the shared knobs a method reads (head_fusion, discard_ratio,
start_layer); the others are not passed to it. `clip_params` are the knobs at the values a method's
authors use on CLIP models (LeGrad's last two blocks, Chefer's last block), for a model that takes
prompts (`LoadedModel.takes_prompts`): `METHODS[name].params_for(loaded.takes_prompts)`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor, nn

from .gradcam import gradcam
from .gradients import CLIP_START_LAYER as CHEFER_CLIP_START_LAYER, Target, chefer_relevance, gradient_rollout
from .legrad import CLIP_START_LAYER as LEGRAD_CLIP_START_LAYER, legrad
from .lrp import attnlrp
from .rollout import attention_rollout

FAMILIES = {   # family -> how the app and the docs (docs/explanations.md) group its methods
    "attention": "attention-based: read the attention maps alone",
    "gradient": "gradient-based: weigh attention or activations by the target class's gradient",
    "relevance": "relevance propagation: share the target logit out, layer by layer, down to the pixels",
}


@dataclass(frozen=True)
class Method:
    """One map method as the app, the command line and the exporter know it: its name, title, family,
    cost and reference, the function that computes its maps, and how it is drawn."""
    name: str                   # the public name
    title: str                  # what captions and menus call it
    family: str                 # a key of FAMILIES
    summary: str                # one line: what it computes
    cost: str                   # passes through the model, beyond the kept trace
    reference: str
    maps: Callable[..., Tensor]   # (model, pixels, target, **params) -> b gh gw
    params: tuple[str, ...] = ()
    from_trace: Callable[..., Tensor] | None = None   # (trace, **params) -> b gh gw, for a kept inference trace
    signed: bool = False        # values for (> 0) and against (< 0) the class: drawn on a scale symmetric about 0
    clip_params: dict = field(default_factory=dict)   # knobs at its authors' values for CLIP models
    reads_attention: bool = True   # False: it applies to a convolutional network too (Grad-CAM, LRP)

    def params_for(self, clip: bool) -> dict:
        """The knobs to pass it by default: its authors' CLIP values for a CLIP model, none otherwise."""
        return dict(self.clip_params) if clip else {}

    @property
    def targeted(self) -> bool:
        """Whether it explains a chosen class (methods of the trace alone give one map for every class)."""
        return self.from_trace is None


def _rollout(model: nn.Module, pixels: Tensor, target: Target = None, **params) -> Tensor:
    return attention_rollout(model.trace(pixels), **params)


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("rollout", "attention rollout", "attention",
           "how much each region feeds the class token through every layer: the product of the layers' "
           "head-averaged attention plus identity", "none (the kept trace)", "Abnar & Zuidema, ACL 2020",
           _rollout, ("head_fusion", "discard_ratio", "start_layer"), from_trace=attention_rollout),
    Method("grad-rollout", "gradient rollout", "gradient",
           "rollout of each layer's attention weighted by the target logit's gradient (head mean, then "
           "negatives clipped)", "1 forward + 1 backward", "jacobgil/vit-explain, each layer with its own gradient",
           gradient_rollout, ("discard_ratio", "start_layer")),
    Method("chefer", "Chefer relevance", "gradient",
           "R <- R + mean_h(clamp(grad * A, 0)) R over the layers: positive gradient-weighted attention, "
           "accumulated", "1 forward + 1 backward", "Chefer, Gur & Wolf, CVPR 2021 (CLIP: their CLIP notebook, "
           "the last block)", chefer_relevance, ("start_layer",), clip_params={"start_layer": CHEFER_CLIP_START_LAYER}),
    Method("legrad", "LeGrad", "gradient",
           "per layer, the positive gradient of that layer's own class score (the classifier on its mean token) "
           "w.r.t. its attention, averaged over heads, queries and layers", "1 forward + per layer the backward from "
           "its score to its attention only: about 2 forwards", "Bousselham et al. 2024, as torchcam 0.5's LeGrad "
           "(CLIP: as legrad_torch 1.1, the last two blocks)", legrad, ("start_layer",),
           clip_params={"start_layer": LEGRAD_CLIP_START_LAYER}),
    Method("gradcam", "Grad-CAM", "gradient",
           "the last block's first-norm activations weighted by the grid-mean of the target logit's gradient, "
           "summed over channels, negatives clipped", "1 forward + a backward through the last block only: "
           "about 1.2 forwards", "Selvaraju et al., ICCV 2017; pytorch-grad-cam's ViT, Swin and CNN recipes", gradcam,
           reads_attention=False),
    Method("attnlrp", "AttnLRP", "relevance",
           "the target logit shared out layer by layer down to the pixels (Gamma rule on linear layers and "
           "convolutions, relevance through the attention values), summed over each token's pixels",
           "1 forward + 1 backward", "Achtibat et al., ICML 2024, as lxt 2.1's ViT (a ResNet: zennit's "
           "EpsilonPlusFlat)", attnlrp, signed=True, reads_attention=False),
]}


def method(name: str) -> Method:
    """The method called `name`, or a ValueError listing the names there are."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    return METHODS[name]
