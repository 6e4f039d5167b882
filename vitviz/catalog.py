"""The models vitviz knows by a short name, in one place: name -> where its checkpoint lives.

Hub entries are the repos timm and Microsoft publish (timm's own `pretrained_cfg` registry names
these repos); they are not pinned to a commit, so `vitviz.load` records the commit it got. The two
bundled models are vitviz's own CIFAR-10 checkpoints in the repository's `checkpoints/` folder and
need no network. Swin, ResNet and ConvNeXt are the designs the transformers are compared with (Liu et
al. 2021 and 2022, He et al. 2016; Raghu et al. 2021 put ViT beside ResNet). DINO and DINOv2 are
self-supervised: they have no classifier, so no predictions.
CLIP models (`takes_prompts`) classify over the prompts a person gives them (`LoadedModel.with_prompts`):
OpenAI's ViT-B/16 from timm's repo of it (open_clip's files beside timm's) and LAION's ViT-B/32
from its own repo (open_clip's files beside transformers').

`size` is the input size a catalog name runs at when the caller names none. DINOv2 runs at 224 px,
not its 518 px: at 518 a ViT-S/14 sees 1,370 tokens, and every attention map a trace keeps is 28x
larger (docs/models.md, "Models without a classifier: DINO and DINOv2").

`DICTIONARIES` are published concept dictionaries (sparse autoencoders) of models vitviz loads, each bound to its
model, block and tokens, so `vitviz.concepts.load(name)` knows what it applies to even where its file does not
say: saev's (Stevens et al. 2025) ReLU dictionaries of 24,576 concepts of OpenAI's CLIP ViT-B/16 and DINOv2
ViT-B/14, and ViT-Prisma's (Joseph et al. 2025) of 49,152 concepts of the last block of LAION's DataComp CLIP
ViT-B/32 (a model the catalog does not list: it is bound to its Hub repo, which `vitviz.load` takes).
`BUNDLED_DICTIONARIES` are vitviz's own, trained on CIFAR-10 for the bundled models, shipped in checkpoints/concepts/.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# the bundled models' folder: the repository's checkpoints/, beside the package; an installed wheel carries it
# inside the package (pyproject.toml maps it to vitviz/checkpoints/)
_PACKAGE = Path(__file__).resolve().parent
CHECKPOINTS = _PACKAGE / "checkpoints" if (_PACKAGE / "checkpoints").is_dir() else _PACKAGE.parent / "checkpoints"


@dataclass(frozen=True)
class CatalogEntry:
    """A model vitviz knows by a short name: where its checkpoint lives, its family, the line menus show
    and the input size it runs at by default."""
    name: str
    source: str          # a Hub repo id, or a folder name under checkpoints/ for a bundled model
    family: str          # a key of `models.FAMILIES`: 'vit', 'cvt', 'swin', 'resnet', 'convnext'
    summary: str         # one line for menus and `python -m vitviz models`
    bundled: bool = False
    size: int | None = None   # input size (px) it runs at by default; None: the checkpoint's own
    takes_prompts: bool = False   # CLIP: a classifier over text prompts once it has them

    @property
    def path(self) -> Path | None:
        """The bundled model's folder (None for Hub models)."""
        return CHECKPOINTS / self.source if self.bundled else None


CATALOG: dict[str, CatalogEntry] = {e.name: e for e in [
    CatalogEntry("vit-tiny", "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", "vit",
                 "ViT-Ti/16, 224 px, ImageNet-21k then 1k (AugReg), 5.7 M parameters"),
    CatalogEntry("vit-small", "timm/vit_small_patch16_224.augreg_in21k_ft_in1k", "vit",
                 "ViT-S/16, 224 px, ImageNet-21k then 1k (AugReg), 22 M parameters"),
    CatalogEntry("vit-base", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "vit",
                 "ViT-B/16, 224 px, ImageNet-21k then 1k (AugReg2), 86 M parameters"),
    CatalogEntry("deit-tiny", "timm/deit_tiny_patch16_224.fb_in1k", "vit",
                 "DeiT-Ti/16, 224 px, ImageNet-1k only, 5.7 M parameters"),
    CatalogEntry("deit-small", "timm/deit_small_patch16_224.fb_in1k", "vit",
                 "DeiT-S/16, 224 px, ImageNet-1k only, 22 M parameters"),
    CatalogEntry("deit-tiny-distilled", "timm/deit_tiny_distilled_patch16_224.fb_in1k", "vit",
                 "DeiT-Ti/16 with a distillation token, 224 px, ImageNet-1k, 5.9 M parameters"),
    CatalogEntry("dino-s16", "timm/vit_small_patch16_224.dino", "vit",
                 "DINO ViT-S/16, self-supervised on ImageNet-1k, no classifier, 224 px, 22 M parameters"),
    CatalogEntry("dino-b16", "timm/vit_base_patch16_224.dino", "vit",
                 "DINO ViT-B/16, self-supervised on ImageNet-1k, no classifier, 224 px, 86 M parameters"),
    CatalogEntry("dino-s8", "timm/vit_small_patch8_224.dino", "vit",
                 "DINO ViT-S/8, self-supervised on ImageNet-1k, no classifier, 224 px (784 patches), 22 M parameters"),
    CatalogEntry("dinov2-s14", "timm/vit_small_patch14_dinov2.lvd142m", "vit",
                 "DINOv2 ViT-S/14, self-supervised on LVD-142M, no classifier, run at 224 px (trained to 518), "
                 "22 M parameters", size=224),
    CatalogEntry("dinov2-b14", "timm/vit_base_patch14_dinov2.lvd142m", "vit",
                 "DINOv2 ViT-B/14, self-supervised on LVD-142M, no classifier, run at 224 px (trained to 518), "
                 "87 M parameters", size=224),
    CatalogEntry("dinov2-s14-reg4", "timm/vit_small_patch14_reg4_dinov2.lvd142m", "vit",
                 "DINOv2 ViT-S/14 with 4 registers, no classifier, run at 224 px (trained to 518), 22 M parameters",
                 size=224),
    CatalogEntry("dinov2-b14-reg4", "timm/vit_base_patch14_reg4_dinov2.lvd142m", "vit",
                 "DINOv2 ViT-B/14 with 4 registers, no classifier, run at 224 px (trained to 518), 87 M parameters",
                 size=224),
    CatalogEntry("clip-b16", "timm/vit_base_patch16_clip_224.openai", "vit",
                 "CLIP ViT-B/16 (OpenAI, 400 M image-text pairs), zero-shot over the prompts you type, 224 px, "
                 "150 M parameters (86 M in the image tower)", takes_prompts=True),
    CatalogEntry("clip-b32-laion", "laion/CLIP-ViT-B-32-laion2B-s34B-b79K", "vit",
                 "CLIP ViT-B/32 (LAION-2B), zero-shot over the prompts you type, 224 px, 151 M parameters "
                 "(88 M in the image tower)", takes_prompts=True),
    CatalogEntry("cvt-13", "microsoft/cvt-13", "cvt", "CvT-13, 224 px, ImageNet-1k, 20 M parameters"),
    CatalogEntry("cvt-21", "microsoft/cvt-21", "cvt", "CvT-21, 224 px, ImageNet-1k, 32 M parameters"),
    CatalogEntry("cvt-13-384", "microsoft/cvt-13-384", "cvt", "CvT-13, 384 px, ImageNet-1k, 20 M parameters"),
    CatalogEntry("cvt-w24-384", "microsoft/cvt-w24-384-22k", "cvt",
                 "CvT-W24, 384 px, ImageNet-22k then 1k, 277 M parameters"),
    CatalogEntry("swin-tiny", "timm/swin_tiny_patch4_window7_224.ms_in1k", "swin",
                 "Swin-T, 7x7 shifted windows, 224 px, ImageNet-1k, 28 M parameters"),
    CatalogEntry("swin-small", "timm/swin_small_patch4_window7_224.ms_in1k", "swin",
                 "Swin-S, 7x7 shifted windows, 224 px, ImageNet-1k, 50 M parameters"),
    CatalogEntry("swin-base", "timm/swin_base_patch4_window7_224.ms_in22k_ft_in1k", "swin",
                 "Swin-B, 7x7 shifted windows, 224 px, ImageNet-22k then 1k, 88 M parameters"),
    CatalogEntry("swin-base-384", "timm/swin_base_patch4_window12_384.ms_in22k_ft_in1k", "swin",
                 "Swin-B, 12x12 shifted windows, 384 px, ImageNet-22k then 1k, 88 M parameters"),
    CatalogEntry("resnet-18", "timm/resnet18.a1_in1k", "resnet",
                 "ResNet-18 (a CNN baseline), 224 px, ImageNet-1k (timm's A1 recipe), 12 M parameters"),
    CatalogEntry("resnet-50", "timm/resnet50.a1_in1k", "resnet",
                 "ResNet-50 (a CNN baseline), 224 px, ImageNet-1k (timm's A1 recipe), 26 M parameters"),
    CatalogEntry("convnext-tiny", "timm/convnext_tiny.fb_in1k", "convnext",
                 "ConvNeXt-T (a CNN built to match Swin), 224 px, ImageNet-1k, 29 M parameters"),
    CatalogEntry("convnext-small", "timm/convnext_small.fb_in1k", "convnext",
                 "ConvNeXt-S, 224 px, ImageNet-1k, 50 M parameters"),
    CatalogEntry("convnext-base", "timm/convnext_base.fb_in22k_ft_in1k", "convnext",
                 "ConvNeXt-B, 224 px, ImageNet-22k then 1k, 89 M parameters"),
    CatalogEntry("vit-cifar10", "vit-cifar10", "vit",
                 "vitviz's own ViT, 32 px CIFAR-10 (bundled, works offline)", bundled=True),
    CatalogEntry("cvt-cifar10", "cvt-cifar10", "cvt",
                 "vitviz's own CvT, 32 px CIFAR-10 (bundled, works offline)", bundled=True),
    CatalogEntry("swin-cifar10", "swin-cifar10", "swin",
                 "vitviz's own Swin (patch 2, 4x4 shifted windows), 32 px CIFAR-10 (bundled, works offline)",
                 bundled=True),
    CatalogEntry("resnet-cifar10", "resnet-cifar10", "resnet",
                 "vitviz's own wide ResNet-14 (He et al.'s CIFAR design), 32 px CIFAR-10 (bundled, works offline)",
                 bundled=True),
]}


# what the app opens with: the ImageNet pair when it can be had, else the bundled pair
IMAGENET_PAIR = ("vit-base", "cvt-13")
BUNDLED_PAIR = ("vit-cifar10", "cvt-cifar10")
# one-click comparisons the app offers: what each shows -> (left, right)
PAIRS = {
    "DINOv2 vs DINOv2 with registers": ("dinov2-s14", "dinov2-s14-reg4"),
    "DINO (self-supervised) vs CvT-13": ("dino-s16", "cvt-13"),
    "ViT-B vs CvT-13 (ImageNet)": IMAGENET_PAIR,
    "CLIP vs supervised ViT-B/16": ("clip-b16", "vit-base"),
    "ViT-B vs Swin-T (windows)": ("vit-base", "swin-tiny"),          # global vs shifted-window attention
    "CvT-13 vs Swin-T": ("cvt-13", "swin-tiny"),                     # convolutional vs windowed attention
    "ViT-B vs ResNet-50 (a CNN)": ("vit-base", "resnet-50"),         # Raghu et al.: do ViTs see like CNNs?
    "Swin-T vs ConvNeXt-T (a CNN)": ("swin-tiny", "convnext-tiny"),  # Liu et al.: a ConvNet for the 2020s
}


@dataclass(frozen=True)
class DictionaryEntry:
    """A published concept dictionary vitviz knows by a short name: the Hub repo (and the folder or file inside it)
    that holds it, the model it was trained on (a catalog name, or a Hub repo the catalog does not list), the block
    whose output tokens it read (an index into the trace's blocks, from 0), which tokens, and a line for menus."""
    name: str
    repo: str
    path_in_repo: str | None   # the dictionary's folder or weights file inside the repo; None: its files at the top
    model: str
    block: int
    tokens: str               # 'patch', 'cls' or 'patch+cls', as `concepts.Origin` names them
    summary: str


DICTIONARIES: dict[str, DictionaryEntry] = {e.name: e for e in [
    # saev's files name neither model nor layer: both are from its documentation (the layer-10 example of its
    # inference guide, `RecordedTransformer(vit, 196, True, [10])`, the class token kept)
    DictionaryEntry("saev-clip-b16", "osunlp/SAE_CLIP_24K_ViT-B-16", None, "clip-b16", 10, "patch+cls",
                    "saev's ReLU dictionary of CLIP ViT-B/16 (OpenAI), block 11 (index 10), 24,576 concepts, "
                    "ImageNet-1k"),
    DictionaryEntry("saev-dinov2-b14", "osunlp/SAE_DINOv2_24K_ViT-B-14", None, "dinov2-b14", 10, "patch+cls",
                    "saev's ReLU dictionary of DINOv2 ViT-B/14, block 11 (index 10), 24,576 concepts, ImageNet-1k"),
    # ViT-Prisma's CLIP checkpoints are `n_images_2600058.pt` (its loaders' default), beside config.json
    DictionaryEntry("prisma-clip-b32-block11",
                    "Prisma-Multimodal/sparse-autoencoder-clip-b-32-sae-vanilla-x64-layer-11-hook_resid_post-l1-1e-05",
                    "n_images_2600058.pt", "laion/CLIP-ViT-B-32-DataComp.XL-s13B-b90K", 11, "patch+cls",
                    "ViT-Prisma's ReLU dictionary of CLIP ViT-B/32 (LAION DataComp.XL), block 12 (index 11) "
                    "resid_post, 49,152 concepts"),
]}


@dataclass(frozen=True)
class BundledDictionary:
    """A concept dictionary vitviz ships (checkpoints/concepts/<name>/, made by checkpoints/concepts/train.sh):
    the models it reads (one, or several for a dictionary across models) and a line for menus."""
    name: str
    models: tuple[str, ...]
    summary: str
    folder: str | None = None   # under checkpoints/concepts/, where it is not `name`

    @property
    def path(self) -> Path:
        return CHECKPOINTS / "concepts" / (self.folder or self.name)


def _at_depth(model: str, block: int, depth: int, concepts: int) -> BundledDictionary:
    return BundledDictionary(f"{model}-block{block}", (model,), f"{model}'s block {block + 1} of {depth} (index "
                             f"{block}), {concepts} concepts (TopK, k 16), for circuits",
                             folder=f"{model}-depths/block{block}")


def _across_run(model: str, steps: tuple[int, ...]) -> BundledDictionary:
    return BundledDictionary(f"{model}-training", tuple(f"{model}@{step}" for step in steps),
                             f"one dictionary across {model}'s training run ({len(steps)} of its checkpoints, step "
                             f"{steps[0]} to {steps[-1]}), last block, 384 concepts: when each concept is born")


# the kept steps of a bundled model's training run that its dictionary across the run reads
# (checkpoints/concepts/training.sh; `concepts.analysis.birth` says when each of its concepts is born)
RUN_DICTIONARY_STEPS = {model: (0, 50, 100, 200, 391, 782, 1564, 2737, 3910, 4692)
                        for model in ("vit-cifar10", "cvt-cifar10")}

BUNDLED_DICTIONARIES: dict[str, BundledDictionary] = {e.name: e for e in [
    BundledDictionary("vit-cifar10-last", ("vit-cifar10",), "vit-cifar10's last block, 768 concepts (TopK, k 16)"),
    BundledDictionary("vit-cifar10-middle", ("vit-cifar10",),
                      "vit-cifar10's block 4 of 7 (index 3), 768 concepts (TopK, k 16)"),
    BundledDictionary("cvt-cifar10-last", ("cvt-cifar10",), "cvt-cifar10's last block, 768 concepts (TopK, k 16)"),
    BundledDictionary("swin-cifar10-last", ("swin-cifar10",), "swin-cifar10's last block, 768 concepts (TopK, k 16)"),
    BundledDictionary("resnet-cifar10-last", ("resnet-cifar10",),
                      "resnet-cifar10's last block, 512 concepts (TopK, k 16)"),
    BundledDictionary("across-cifar10", ("vit-cifar10", "cvt-cifar10", "swin-cifar10", "resnet-cifar10"),
                      "one dictionary across the four CIFAR-10 models' last blocks, 768 shared concepts on their "
                      "common 4 x 4 cells"),
    BundledDictionary("across-vit-cvt-cifar10", ("vit-cifar10", "cvt-cifar10"),
                      "one dictionary across the bundled pair a block before their last (vit-cifar10's block 6, "
                      "cvt-cifar10's block 8; indexes 5 and 7), 768 shared concepts on their common 4 x 4 cells: "
                      "circuits side by side"),
    # checkpoints/concepts/depths.sh: three blocks spread over each model's depth, the dictionaries a circuit reads
    *(_at_depth(model, block, depth, concepts) for model, depth, blocks in (
        ("vit-cifar10", 7, ((1, 768), (3, 768), (5, 768))), ("cvt-cifar10", 9, ((1, 512), (3, 768), (5, 768))),
        ("swin-cifar10", 10, ((0, 192), (2, 384), (6, 768))), ("resnet-cifar10", 6, ((1, 128), (3, 256), (4, 512))))
      for block, concepts in blocks),
    *(_across_run(model, steps) for model, steps in RUN_DICTIONARY_STEPS.items()),
]}
# the dictionaries a bundled model's circuit reads, in depth order (checkpoints/concepts/depths.sh and train.sh)
CIRCUIT_DICTIONARIES: dict[str, tuple[str, ...]] = {
    model: (*(name for name, entry in BUNDLED_DICTIONARIES.items()
              if entry.models == (model,) and entry.folder is not None), f"{model}-last")
    for model in ("vit-cifar10", "cvt-cifar10", "swin-cifar10", "resnet-cifar10")}
# the bundled pair's class circuits over CIFAR-10's test images (checkpoints/circuits/classes.sh)
CLASS_CIRCUITS = CHECKPOINTS / "circuits"
# the concept atlas of the bundled dictionaries, where it is built (`vitviz atlas --out checkpoints/atlas`; built,
# not committed): the app serves it under /atlas
ATLAS = CHECKPOINTS / "atlas"


def model_name(source: str) -> str:
    """The catalog's short name for a model's Hub repo, or `source` itself where the catalog has none."""
    return next((e.name for e in CATALOG.values() if e.source == source and not e.bundled), source)


def bundled() -> list[CatalogEntry]:
    """The catalog's bundled models (their checkpoints ship with vitviz, so they load offline), in catalog
    order."""
    return [e for e in CATALOG.values() if e.bundled]
