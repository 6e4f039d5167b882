"""What the areas share: one run's settings (`Bench`) and what it makes once for all of them: checkpoints with
random weights in the real Hub layouts (timm's `config.json` + `model.safetensors`, transformers'
`save_pretrained`), written to the run's temporary folder and loaded through `vitviz.load` as the app loads them,
the bundled pair or stand-ins of it, and the photos."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image

import vitviz
from timing import CLOCKS, Timing, same_logits, timed
from vitviz import catalog
from vitviz.bundle import save_bundle
from vitviz.models import FAMILIES, ViTConfig
from vitviz.preprocess import Transform

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
TINY_VIT = dict(depth=2, embed_dim=32, num_heads=2)                               # --quick
# transformers indexes per-block drop-path rates by stage, so stage i needs at least i + 1 blocks
TINY_CVT = dict(embed_dim=[16, 24, 32], depth=[1, 2, 3], num_heads=[1, 1, 2])     # --quick
CVT_13_PROCESSOR = {   # microsoft/cvt-13's preprocessor_config.json
    "crop_pct": 0.875, "do_normalize": True, "do_resize": True, "feature_extractor_type": "ConvNextFeatureExtractor",
    "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3, "size": 224}


@dataclass
class Bench:
    quick: bool
    repeats: int
    tmp: Path
    device: torch.device = torch.device("cpu")
    autocast: bool = False          # bf16 autocast around every timed forward (both contenders)
    clock: str = "wall"
    batches: tuple[int, ...] = (1, 8)
    results: dict = field(default_factory=dict)   # medians one area leaves for another (peak reads forward's)

    @property
    def warmup(self) -> int:
        return 3 if self.device.type == "cuda" else 1   # kernel selection and caches settle on a GPU

    def amp(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    def time(self, contenders: dict[str, Callable[[], object]]) -> dict[str, Timing]:
        """`timing.timed` with this run's repeats, warm-up and clock."""
        return timed(contenders, repeats=self.repeats, warmup=self.warmup, clock=CLOCKS[self.clock])

    def folder(self, name: str) -> Path:
        path = self.tmp / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def timm_vit(self, shape: str, img_size: int | None = None):
        """(timm model, vitviz LoadedModel) with the same random weights, through timm's Hub layout; `img_size`:
        the model made for that input size instead of its own."""
        import timm
        from timm.models import save_for_hf

        torch.manual_seed(0)
        size = {} if img_size is None else {"img_size": img_size}
        reference = timm.create_model(shape, pretrained=False, **(TINY_VIT if self.quick else {}), **size).eval()
        folder = self.folder(shape if img_size is None else f"{shape}-{img_size}")
        if not (folder / "model.safetensors").is_file():
            save_for_hf(reference, str(folder), safe_serialization=True)
        return reference.to(self.device), vitviz.load(str(folder), device=self.device)

    def timm_family(self, name: str, quick_args: dict):
        """(timm model, vitviz LoadedModel) with the same random weights (BatchNorm statistics moved off their
        initial values), through timm's Hub layout; `quick_args`: the tiny shape --quick builds."""
        import timm
        from timm.models import save_for_hf

        torch.manual_seed(0)
        reference = timm.create_model(name, pretrained=False, **(quick_args if self.quick else {})).eval()
        with torch.no_grad():
            for key, buffer in reference.named_buffers():
                if key.endswith(("running_mean", "running_var")):
                    buffer.copy_(torch.rand_like(buffer) * 0.5 + (0.75 if key.endswith("var") else -0.25))
        folder = self.folder(name)
        if not (folder / "model.safetensors").is_file():
            save_for_hf(reference, str(folder), safe_serialization=True)
        return reference.to(self.device), vitviz.load(str(folder), device=self.device)

    @cached_property
    def vit_base(self):
        return self.timm_vit("vit_base_patch16_224")

    @cached_property
    def cvt_13(self):
        """(transformers CvtForImageClassification, vitviz LoadedModel): CvT-13 in microsoft/cvt-13's layout."""
        from transformers import CvtConfig, CvtForImageClassification

        torch.manual_seed(0)
        config = CvtConfig(num_labels=1000, **(TINY_CVT if self.quick else {}))
        reference = CvtForImageClassification(config).eval()
        with torch.no_grad():   # BatchNorm statistics a trained model would have, not 0 and 1
            for name, buffer in reference.named_buffers():
                if name.endswith(("running_mean", "running_var")):
                    buffer.copy_(torch.rand_like(buffer) * 0.5 + (0.75 if name.endswith("var") else -0.25))
        folder = self.folder("cvt-13")
        reference.save_pretrained(folder)
        (folder / "preprocessor_config.json").write_text(json.dumps(CVT_13_PROCESSOR, indent=2))
        return reference.to(self.device), vitviz.load(str(folder), device=self.device)

    @cached_property
    def bundled_pair(self) -> tuple[str, str, str]:
        """(vit, cvt, what they are): the bundled CIFAR-10 checkpoints when trained, else random-weight
        stand-ins of the same architectures (same cost per forward) written as bundles."""
        from vitviz.train import ARCHITECTURES, CIFAR_MEAN, CIFAR_STD

        names = catalog.BUNDLED_PAIR
        if not self.quick and all((catalog.CATALOG[n].path / "config.json").is_file() for n in names):
            return (*names, "bundled pair")
        paths = []
        for name, arch in zip(names, ("vit-micro", "cvt-micro") if self.quick else ("vit-cifar", "cvt-cifar")):
            config = ARCHITECTURES[arch]
            torch.manual_seed(0)
            model = FAMILIES["vit" if isinstance(config, ViTConfig) else "cvt"][0](config)
            transform = Transform(crop=(32, 32), resize=32, mean=CIFAR_MEAN, std=CIFAR_STD)
            path = self.folder(f"stand-in-{name}")
            save_bundle(path, model.eval(), transform=transform, labels=[f"class {i}" for i in range(10)])
            paths.append(str(path))
        return (*paths, f"stand-ins for the bundled pair ({'micro' if self.quick else 'same architectures'}, "
                        "random weights: checkpoints/ not trained yet)")

    @cached_property
    def imagenet_pair(self) -> tuple[str, str]:
        return str(self.vit_base[1].source.location), str(self.cvt_13[1].source.location)

    @cached_property
    def jpeg(self) -> Path:
        """A 12-megapixel phone-like JPEG (a real photo upscaled, with sensor noise); 1 MP with --quick."""
        size = (1200, 900) if self.quick else (4000, 3000)
        photo = Image.open(PHOTO).convert("RGB").resize(size, Image.BICUBIC)
        noisy = np.asarray(photo, np.float32) + np.random.default_rng(0).normal(0, 4, (size[1], size[0], 3))
        path = self.tmp / f"photo-{size[0]}x{size[1]}.jpg"
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(path, quality=92)
        return path


def photos(count: int, size: tuple[int, int]) -> list[Image.Image]:
    """`count` different photos of `size` (w, h): the example photo turned a little more each time."""
    photo = Image.open(PHOTO).convert("RGB").resize(size, Image.BICUBIC)
    return [photo.rotate(7 * i) for i in range(count)]


def against_timm(bench: Bench, loaded, reference, pixels: torch.Tensor, what: str) -> dict[str, Timing]:
    """vitviz's forward, its trace and timm's forward on the same pixels, once the two models are checked to
    compute the same logits: the timings by name ('vitviz', 'traced', 'timm')."""
    with torch.inference_mode():
        same_logits(loaded.model(pixels), reference(pixels), what)
        with bench.amp():
            return bench.time({"vitviz": lambda: loaded.model(pixels), "traced": lambda: loaded.model.trace(pixels),
                               "timm": lambda: reference(pixels)})
