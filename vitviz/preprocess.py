"""A checkpoint's own preprocessing: resize, centre crop, normalise; and the way back to image pixels.

One `Transform` describes both timm's eval pipeline (resize the shorter side to
floor(size / crop_pct), bicubic, centre crop), transformers' ConvNeXt image processor (CvT, ResNet,
ConvNeXt: shorter side to 256 then crop 224; a plain resize to 384x384 at 384) and its ViT image
processor (Swin: a plain resize to 224x224), so every view can invert exactly what the model saw.
`Transform.from_timm`, `Transform.from_convnext_processor`, `Transform.from_vit_processor`,
`Transform.from_open_clip` and `Transform.from_clip_processor` read those from the checkpoint's own
config; all resize with PIL, as timm's `create_transform`, open_clip's transform (torchvision on PIL
images) and transformers' PIL image processors do, so the pixels are the same (the tests compare them).

CLIP's text side is preprocessing too: `prompts_from_text` turns what a person types ("dog, ball,
grass") into prompts through CLIP's template, and `Tokenizer` turns prompts into token ids.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HF_STANDARD_MEAN = HF_STANDARD_STD = (0.5, 0.5, 0.5)   # transformers' IMAGENET_STANDARD_*: its processors' default
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)        # OpenAI's, open_clip's OPENAI_DATASET_MEAN
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PROMPT_TEMPLATE = "a photo of a {}"   # CLIP's default prompt (Radford et al. 2021, section 3.1.4)
_RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}
_PIL_CODES = {int(code): name for name, code in _RESAMPLE.items()}   # transformers stores PIL's numbers
_CROP_ROUNDING = ("round", "floor")
TIMM_DEFAULT_CROP_PCT = 0.875                 # timm.data.DEFAULT_CROP_PCT, used when a pretrained_cfg has none
CVT_PLAIN_RESIZE_FROM = 384                   # the ConvNeXt/CvT processor stops cropping at this size


@dataclass(frozen=True)
class Transform:
    """A checkpoint's preprocessing: resize (shorter side or exact size), centre crop, normalise; and
    the way back from the model's pixels to the image's."""
    crop: tuple[int, int]             # (h, w) the model sees
    resize: int | tuple[int, int]     # int: shorter side to this many px; (h, w): exact size (no crop margin)
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bicubic"
    # where an odd crop margin puts the extra pixel: 'round' is torchvision's CenterCrop (timm),
    # round-half-to-even; 'floor' is transformers' image processors
    crop_rounding: str = "round"

    def __post_init__(self):
        object.__setattr__(self, "crop", tuple(self.crop))
        object.__setattr__(self, "resize", self.resize if isinstance(self.resize, int) else tuple(self.resize))
        object.__setattr__(self, "mean", tuple(self.mean))
        object.__setattr__(self, "std", tuple(self.std))
        if self.interpolation not in _RESAMPLE:
            raise ValueError(f"interpolation must be one of {sorted(_RESAMPLE)}, not {self.interpolation!r}")
        if self.crop_rounding not in _CROP_ROUNDING:
            raise ValueError(f"crop_rounding must be one of {_CROP_ROUNDING}, not {self.crop_rounding!r}")
        rh, rw = (self.resize, self.resize) if isinstance(self.resize, int) else self.resize
        if min(self.crop) < 1 or rh < self.crop[0] or rw < self.crop[1]:
            raise ValueError(f"the resize {self.resize} must leave at least the crop {self.crop}")

    @classmethod
    def from_timm(cls, pretrained_cfg: dict) -> "Transform":
        """timm's eval transform for a `pretrained_cfg`, as `resolve_data_config` + `create_transform` build it.

        Only what the ViTs on the Hub use: a square input and crop_mode 'center'.
        """
        _, h, w = pretrained_cfg.get("input_size") or (3, 224, 224)
        crop_mode = pretrained_cfg.get("crop_mode") or "center"
        if h != w or crop_mode != "center":
            raise ValueError(f"only square inputs with crop_mode 'center' are supported, not input_size "
                             f"{h}x{w} with crop_mode {crop_mode!r}")
        crop_pct = pretrained_cfg.get("crop_pct") or TIMM_DEFAULT_CROP_PCT
        return cls(crop=(h, w), resize=math.floor(h / crop_pct), mean=pretrained_cfg.get("mean") or IMAGENET_MEAN,
                   std=pretrained_cfg.get("std") or IMAGENET_STD,
                   interpolation=pretrained_cfg.get("interpolation") or "bicubic")

    @classmethod
    def from_convnext_processor(cls, config: dict) -> "Transform":
        """The transform of a transformers `ConvNextImageProcessor` config (`preprocessor_config.json` of a CvT,
        ResNet or ConvNeXt).

        Below 384 px the shorter side goes to int(size / crop_pct), then a centre crop of size x size;
        at 384 and above the image is resized to size x size, no crop. Keys a config leaves out take
        the processor's own defaults, as transformers does.
        """
        kind = config.get("image_processor_type") or config.get("feature_extractor_type") or "ConvNextImageProcessor"
        if not kind.startswith("ConvNext"):
            raise ValueError(f"expected a ConvNextImageProcessor, not {kind}")
        unsupported = [key for key, value in (("do_resize", True), ("do_rescale", True), ("do_normalize", True),
                                              ("do_center_crop", False)) if config.get(key, value) != value]
        if not math.isclose(config.get("rescale_factor", 1 / 255), 1 / 255):
            unsupported.append("rescale_factor")
        if unsupported:
            raise ValueError(f"unsupported ConvNextImageProcessor settings: {', '.join(unsupported)}")
        size = config.get("size", {"shortest_edge": CVT_PLAIN_RESIZE_FROM})
        edge = size if isinstance(size, int) else size.get("shortest_edge")
        resample = config.get("resample", int(Image.BICUBIC))
        if not isinstance(edge, int) or resample not in _PIL_CODES:
            raise ValueError(f"unsupported ConvNextImageProcessor size {size!r} or resample {resample!r}")
        common = dict(crop=(edge, edge), mean=config.get("image_mean") or HF_STANDARD_MEAN,
                      std=config.get("image_std") or HF_STANDARD_STD, interpolation=_PIL_CODES[resample],
                      crop_rounding="floor")
        if edge >= CVT_PLAIN_RESIZE_FROM:
            return cls(resize=(edge, edge), **common)
        return cls(resize=int(edge / (config.get("crop_pct") or 224 / 256)), **common)

    @classmethod
    def from_vit_processor(cls, config: dict) -> "Transform":
        """The transform of a transformers `ViTImageProcessor` config (`preprocessor_config.json` of microsoft/
        swin-*): the image resized to `size` exactly, no crop; keys it leaves out take the processor's defaults
        (bilinear, mean and std 0.5)."""
        kind = config.get("image_processor_type") or config.get("feature_extractor_type") or "ViTImageProcessor"
        if not kind.startswith("ViT"):
            raise ValueError(f"expected a ViTImageProcessor, not {kind}")
        unsupported = [key for key, value in (("do_resize", True), ("do_rescale", True), ("do_normalize", True))
                       if config.get(key, value) != value]
        if unsupported:
            raise ValueError(f"unsupported ViTImageProcessor settings: {', '.join(unsupported)}")
        size = config.get("size", {"height": 224, "width": 224})
        size = (size, size) if isinstance(size, int) else (size.get("height"), size.get("width"))
        resample = config.get("resample", int(Image.BILINEAR))
        if not all(isinstance(n, int) for n in size) or resample not in _PIL_CODES:
            raise ValueError(f"unsupported ViTImageProcessor size {size!r} or resample {resample!r}")
        return cls(crop=size, resize=size, mean=config.get("image_mean") or HF_STANDARD_MEAN,
                   std=config.get("image_std") or HF_STANDARD_STD, interpolation=_PIL_CODES[resample],
                   crop_rounding="floor")

    @classmethod
    def from_open_clip(cls, preprocess_cfg: dict, image_size: int) -> "Transform":
        """open_clip's eval transform for its `preprocess_cfg` (open_clip_config.json): the shorter side to
        `image_size` (bicubic by default), centre crop, the config's mean and std (OpenAI's by default)."""
        mode = preprocess_cfg.get("resize_mode") or "shortest"
        if mode != "shortest":
            raise ValueError(f"only resize_mode 'shortest' is supported, not {mode!r}")
        return cls(crop=(image_size, image_size), resize=image_size, mean=preprocess_cfg.get("mean") or CLIP_MEAN,
                   std=preprocess_cfg.get("std") or CLIP_STD,
                   interpolation=preprocess_cfg.get("interpolation") or "bicubic")

    @classmethod
    def from_clip_processor(cls, config: dict) -> "Transform":
        """The transform of a transformers `CLIPImageProcessor` config (preprocessor_config.json): the shorter
        side to `size`, centre crop `crop_size`; keys it leaves out take the processor's defaults."""
        unsupported = [key for key, value in (("do_resize", True), ("do_rescale", True), ("do_normalize", True),
                                              ("do_center_crop", True)) if config.get(key, value) != value]
        if unsupported:
            raise ValueError(f"unsupported CLIPImageProcessor settings: {', '.join(unsupported)}")
        size, crop = config.get("size", {"shortest_edge": 224}), config.get("crop_size", {"height": 224, "width": 224})
        edge = size if isinstance(size, int) else size.get("shortest_edge")
        crop = (crop, crop) if isinstance(crop, int) else (crop.get("height"), crop.get("width"))
        resample = config.get("resample", int(Image.BICUBIC))
        if not isinstance(edge, int) or not all(isinstance(n, int) for n in crop) or resample not in _PIL_CODES:
            raise ValueError(f"unsupported CLIPImageProcessor size {size!r}, crop_size {crop!r} or "
                             f"resample {resample!r}")
        return cls(crop=crop, resize=edge, mean=config.get("image_mean") or CLIP_MEAN,
                   std=config.get("image_std") or CLIP_STD, interpolation=_PIL_CODES[resample], crop_rounding="floor")

    def to_dict(self) -> dict:
        return asdict(self)

    def resized_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """(h, w) of an image of `size` (h, w) after the resize step (torchvision's rounding)."""
        if not isinstance(self.resize, int):
            return self.resize
        h, w = size
        short, long = (h, w) if h <= w else (w, h)
        new_short, new_long = self.resize, int(self.resize * long / short)
        return (new_short, new_long) if h <= w else (new_long, new_short)

    def crop_box(self, size: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the centre crop inside the resized image."""
        rh, rw = self.resized_size(size)
        ch, cw = self.crop
        if self.crop_rounding == "floor":
            return (rh - ch) // 2, (rw - cw) // 2, ch, cw
        return int(round((rh - ch) / 2.0)), int(round((rw - cw) / 2.0)), ch, cw

    def normalize(self, rgb: Tensor) -> Tensor:
        """b 3 h w floats in [0, 1] -> normalised pixels."""
        mean = torch.tensor(self.mean, dtype=rgb.dtype, device=rgb.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=rgb.dtype, device=rgb.device).view(1, 3, 1, 1)
        return (rgb - mean) / std

    def __call__(self, image: Image.Image) -> Tensor:
        """RGB PIL image -> 1 3 h w pixel batch."""
        top, left, ch, cw = self.crop_box((image.height, image.width))
        rh, rw = self.resized_size((image.height, image.width))
        image = image.convert("RGB").resize((rw, rh), _RESAMPLE[self.interpolation])
        image = image.crop((left, top, left + cw, top + ch))
        rgb = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
        return self.normalize(rgb)


# ---- CLIP's text side -------------------------------------------------------------------------------------

def prompts_from_text(text: str, template: str = PROMPT_TEMPLATE) -> list[str]:
    """What a person types -> CLIP prompts: "dog, ball, grass" -> ["a photo of a dog", "a photo of a ball",
    "a photo of a grass"]. Comma-separated, each part stripped, empty parts and repeats dropped; `template`
    has one {} for the words."""
    if not isinstance(text, str):
        raise ValueError(f"prompts are text, not {type(text).__name__}")
    if template.count("{}") != 1:
        raise ValueError(f"a prompt template has one {{}} for the words, not {template!r}")
    words = dict.fromkeys(part.strip() for part in text.split(","))
    return [template.format(word) for word in words if word]


class Tokenizer:
    """CLIP's byte-pair tokenizer (open_clip's `SimpleTokenizer`, whose vocabulary ships inside its wheel,
    so it works offline): texts -> b context_length token ids, start and end of text around each text's
    tokens (cut to fit), zeros after."""

    def __init__(self, context_length: int = 77):
        from open_clip.tokenizer import SimpleTokenizer  # imports in a second; only CLIP models need it

        self._bpe = SimpleTokenizer(context_length=context_length)
        self.context_length = context_length

    def __call__(self, texts: list[str]) -> Tensor:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("tokenize a list of texts")
        return self._bpe(list(texts))

    def has_vocabulary(self, vocab: dict[str, int], merges: list[str]) -> bool:
        """Whether a tokenizer's vocab.json and merges.txt (the BPE merges in rank order, without the
        '#version' line) are this tokenizer's, so its ids are the same. OpenAI's files (and transformers')
        name the start and end of text `<|startoftext|>` and `<|endoftext|>`, open_clip `<start_of_text>` and
        `<end_of_text>`: the same two ids."""
        bpe = self._bpe
        specials = {bpe.decoder[bpe.sot_token_id]: "<|startoftext|>", bpe.decoder[bpe.eot_token_id]: "<|endoftext|>"}
        ranked = [" ".join(pair) for pair, _ in sorted(bpe.bpe_ranks.items(), key=lambda item: item[1])]
        return vocab == {specials.get(token, token): i for token, i in bpe.encoder.items()} and merges == ranked
