"""vitviz against its peers on the same weights, in one run, as ratios (they survive a noisy machine).

    .venv/bin/python benchmarks/bench.py                     # everything (2-core CPU: about 20 minutes)
    .venv/bin/python benchmarks/bench.py --only forward cvt  # some items
    .venv/bin/python benchmarks/bench.py --threads 1 --clock cpu   # a shared machine: CPU time of one thread
    .venv/bin/python benchmarks/bench.py --quick             # tiny models, few repeats (the smoke test)
    .venv/bin/python benchmarks/bench.py --device cuda --autocast --batches 1 32   # a GPU (gpu_check.sh)

Items (issue 8): forward (1), cvt (2), traced (3), pipeline (4), request (5), rerender (6),
coldstart (7), memory (8), peak (9); issue 14: attribution (each explanation method against its
reference package); issue 15: evaluate (against its floor of batched forwards), quantus (region
perturbation against Quantus's), explain (batch explain images/s with --formats npy); issue 24: decide
(direct logit attribution against a traced forward; activation patching against its floor of batched
forwards and against forward hooks on timm); issue 23: compare (CKA of every layer pair against the
traced forwards it needs, and against pytorch-cka's hook-based pass); issue 25: clip (CLIP image and
text features against open_clip's, LeGrad-CLIP against legrad_torch's algorithm); issue 29: swin (Swin-T
against timm: forwards, traced forward, rollout to stage 1 against a traced forward, the memory a trace keeps
against its windowed attention); issue 30: cnn (ResNet-50 and ConvNeXt-T against timm, every block's
receptive field against hooks and autograd on timm); issue 31: video (frames per second end to end against
the same frames' batched traced forwards alone). Every time is
min / median / max over `--repeats` rounds after warm-up; in each round the contenders run once each,
in rotating order, so a slow spell of the machine hits all of them. Ratios are of medians. Contenders are checked to compute the same logits
before they are timed. Checkpoints are random weights in the real Hub layouts (timm's `config.json`
+ `model.safetensors`, transformers' `save_pretrained`), written to a temporary folder and loaded
through `vitviz.load`, as the app loads them; no network is used.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # app.py and tests/app_server.py

import vitviz  # noqa: E402
from vitviz import catalog  # noqa: E402
from vitviz.bundle import save_bundle  # noqa: E402
from vitviz.image import read_image  # noqa: E402
from vitviz.models import FAMILIES, ViTConfig  # noqa: E402
from vitviz.preprocess import Transform  # noqa: E402
from vitviz.session import ModelRun, decode_side  # noqa: E402

ITEMS = ("forward", "cvt", "traced", "pipeline", "request", "rerender", "coldstart", "memory", "peak", "attribution",
         "evaluate", "quantus", "explain", "decide", "compare", "clip", "swin", "cnn", "video")
TARGETS = {"forward": 1.00, "cvt": 1.00, "traced": 1.30, "pipeline": 0.80, "request": 1.50, "rerender": 0.10,
           "coldstart": 1.50, "coldstart-floor": 1.15, "import": 1.15, "attribution": 1.00, "evaluate": 1.25, "quantus": 1.00,
           "decide": 1.30, "decide-floor": 1.10, "decide-hooks": 1.00, "compare": 1.20, "compare-cka": 1.00,
           "clip": 1.00, "clip-legrad": 0.97, "swin": 1.00, "swin-traced": 1.30, "swin-rollout": 0.20, "swin-memory": 2.00,
           "cnn": 1.00, "cnn-traced": 1.20, "cnn-receptive": 1.10, "video": 1.25}
EXPLAIN_IMAGES_S = 10   # batch explain with --formats npy, and png npy, bundled pair, images per second (at least)
VIT_SHAPES = ("vit_small_patch16_224", "vit_base_patch16_224")
TINY_VIT = dict(depth=2, embed_dim=32, num_heads=2)                               # --quick
# transformers indexes per-block drop-path rates by stage, so stage i needs at least i + 1 blocks
TINY_CVT = dict(embed_dim=[16, 24, 32], depth=[1, 2, 3], num_heads=[1, 1, 2])     # --quick
CVT_13_PROCESSOR = {   # microsoft/cvt-13's preprocessor_config.json
    "crop_pct": 0.875, "do_normalize": True, "do_resize": True, "feature_extractor_type": "ConvNextFeatureExtractor",
    "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3, "size": 224}
PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
APP_REQUESTS = 20       # item 8: requests over HTTP before the memory is read
WARM_REQUESTS = 5       # item 7: requests after the first, the yardstick of the cold start (2 with --quick)


# ---- timing -------------------------------------------------------------------------------------------

@dataclass
class Timing:
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def __str__(self) -> str:
        return " / ".join(_ms(t) for t in (min(self.seconds), self.median, max(self.seconds))) + " ms"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}"


# 'cpu': this process's CPU time, which other jobs on a shared machine do not inflate (with one thread)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def timed(contenders: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 1,
          clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Each contender `warmup` times, then `repeats` interleaved rounds in rotating order."""
    names = list(contenders)
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)   # GPU work is asynchronous
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    seconds = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sync()
            start = clock()
            contenders[name]()
            sync()
            seconds[name].append(clock() - start)
    return {name: Timing(s) for name, s in seconds.items()}


def verdict(item: str, ratio: float) -> str:
    target = TARGETS[item]
    return f"ratio {ratio:.2f} (target <= {target:.2f}) {'OK' if ratio <= target else 'MISSED'}"


def report(line: str) -> None:
    print(line, flush=True)


def same_logits(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Refuse to time two models that do not compute the same function."""
    error = (ours.float() - theirs.float()).abs().max().item()
    scale = theirs.float().abs().max().item()
    if not error <= 1e-3 * max(1.0, scale):
        raise SystemExit(f"{what}: the two models disagree (max logit difference {error:.3g}): not timed")


def against_timm(bench: "Bench", loaded, reference, pixels: torch.Tensor, what: str) -> dict:
    """vitviz's forward, its trace and timm's forward on the same pixels, once the two models are checked to
    compute the same logits: the timings by name ('vitviz', 'traced', 'timm')."""
    with torch.inference_mode():
        same_logits(loaded.model(pixels), reference(pixels), what)
        with bench.amp():
            return bench.time({"vitviz": lambda: loaded.model(pixels), "traced": lambda: loaded.model.trace(pixels),
                               "timm": lambda: reference(pixels)})


# ---- the checkpoints ------------------------------------------------------------------------------------

@dataclass
class Bench:
    quick: bool
    repeats: int
    tmp: Path
    device: torch.device = torch.device("cpu")
    autocast: bool = False          # bf16 autocast around every timed forward (both contenders)
    clock: str = "wall"
    batches: tuple[int, ...] = (1, 8)
    results: dict = field(default_factory=dict)

    @property
    def warmup(self) -> int:
        return 3 if self.device.type == "cuda" else 1   # kernel selection and caches settle on a GPU

    def amp(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    def time(self, contenders: dict[str, Callable[[], object]]) -> dict[str, Timing]:
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

    @cached_property
    def app(self):
        """The page's handlers (`vitviz.ui`), running the models on this bench's device."""
        from vitviz.ui import attention, gpu, page
        gpu.DEVICE = str(self.device)
        gpu.LOCAL_ALLOWED.update(self.imagenet_pair)
        gpu.LOCAL_ALLOWED.update(self.bundled_pair[:2])
        return SimpleNamespace(attention=attention, gpu=gpu, page=page)


# ---- 1 and 3: ViT forward, plain and traced, against timm --------------------------------------------------

def vit_forward(bench: Bench, items: set[str]) -> None:
    for shape in VIT_SHAPES:
        reference, loaded = bench.vit_base if shape == "vit_base_patch16_224" else bench.timm_vit(shape)
        for batch in bench.batches:
            t = against_timm(bench, loaded, reference, torch.randn(batch, 3, 224, 224, device=bench.device), shape)
            bench.results[("forward", shape, batch)] = t["vitviz"].median
            if "forward" in items:
                report(f"vit forward b{batch} {shape}: vitviz {t['vitviz']}, timm {t['timm']}, "
                       + verdict("forward", t["vitviz"].median / t["timm"].median))
            if "traced" in items:
                report(f"vit traced b{batch} {shape}: vitviz trace {t['traced']}, timm plain {t['timm']}, "
                       + verdict("traced", t["traced"].median / t["timm"].median))


# ---- 2: CvT against transformers ---------------------------------------------------------------------

def cvt_forward(bench: Bench, items: set[str]) -> None:
    reference, loaded = bench.cvt_13
    for batch in bench.batches:
        pixels = torch.randn(batch, 3, 224, 224, device=bench.device)
        with torch.inference_mode():
            same_logits(loaded.model(pixels), reference(pixel_values=pixels).logits, "CvT-13")
            with bench.amp():
                t = bench.time({"vitviz": lambda: loaded.model(pixels),
                                "transformers": lambda: reference(pixel_values=pixels).logits})
        report(f"cvt forward b{batch} CvT-13: vitviz {t['vitviz']}, transformers {t['transformers']}, "
               + verdict("cvt", t["vitviz"].median / t["transformers"].median))


# ---- 4: the explain pipeline a user would otherwise write ---------------------------------------------

def hf_vit_from_timm(reference, loaded):
    """transformers' ViTForImageClassification (eager attention) with the timm model's weights."""
    from transformers import ViTConfig, ViTForImageClassification

    c = loaded.model.config
    config = ViTConfig(hidden_size=c.embed_dim, num_hidden_layers=c.depth, num_attention_heads=c.num_heads,
                       intermediate_size=int(c.embed_dim * c.mlp_ratio), image_size=c.img_size[0],
                       patch_size=c.patch_size, num_labels=c.num_classes, layer_norm_eps=1e-6,
                       attn_implementation="eager")
    model = ViTForImageClassification(config).eval()
    timm_sd = reference.state_dict()
    state = {"vit.embeddings.cls_token": timm_sd["cls_token"],
             "vit.embeddings.position_embeddings": timm_sd["pos_embed"],
             "vit.layernorm.weight": timm_sd["norm.weight"], "vit.layernorm.bias": timm_sd["norm.bias"],
             "classifier.weight": timm_sd["head.weight"], "classifier.bias": timm_sd["head.bias"]}
    for kind in ("weight", "bias"):
        state[f"vit.embeddings.patch_embeddings.projection.{kind}"] = timm_sd[f"patch_embed.proj.{kind}"]
        for i in range(c.depth):
            ours, theirs = f"vit.layers.{i}.", f"blocks.{i}."
            q, k, v = timm_sd[f"{theirs}attn.qkv.{kind}"].chunk(3)
            state.update({f"{ours}attention.q_proj.{kind}": q, f"{ours}attention.k_proj.{kind}": k,
                          f"{ours}attention.v_proj.{kind}": v,
                          f"{ours}attention.o_proj.{kind}": timm_sd[f"{theirs}attn.proj.{kind}"],
                          f"{ours}layernorm_before.{kind}": timm_sd[f"{theirs}norm1.{kind}"],
                          f"{ours}layernorm_after.{kind}": timm_sd[f"{theirs}norm2.{kind}"],
                          f"{ours}mlp.fc1.{kind}": timm_sd[f"{theirs}mlp.fc1.{kind}"],
                          f"{ours}mlp.fc2.{kind}": timm_sd[f"{theirs}mlp.fc2.{kind}"]})
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"this transformers version names ViT weights differently: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    return model.to(loaded.device)


def jacobgil_rollout(attentions, discard_ratio: float, head_fusion: str) -> np.ndarray:
    """jacobgil/vit-explain's `rollout` (vit_rollout.py), as published, quirks included."""
    result = torch.eye(attentions[0].size(-1))
    with torch.no_grad():
        for attention in attentions:
            if head_fusion == "mean":
                fused = attention.mean(axis=1)
            elif head_fusion == "max":
                fused = attention.max(axis=1)[0]
            else:
                fused = attention.min(axis=1)[0]
            flat = fused.view(fused.size(0), -1)
            _, indices = flat.topk(int(flat.size(-1) * discard_ratio), -1, False)
            indices = indices[indices != 0]
            flat[0, indices] = 0
            eye = torch.eye(fused.size(-1))
            a = (fused + 1.0 * eye) / 2
            a = a / a.sum(dim=-1)
            result = torch.matmul(a, result)
    mask = result[0, 0, 1:]
    width = int(mask.size(-1) ** 0.5)
    mask = mask.reshape(width, width).numpy()
    return mask / np.max(mask)


def show_mask_on_image(img: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """jacobgil/vit-explain's OpenCV overlay (vit_explain.py)."""
    import cv2
    heatmap = np.float32(cv2.applyColorMap(np.uint8(255 * mask), cv2.COLORMAP_JET)) / 255
    cam = heatmap + np.float32(img) / 255
    return np.uint8(255 * cam / np.max(cam))


def pipeline(bench: Bench, items: set[str]) -> None:
    import cv2

    reference, loaded = bench.vit_base
    hf = hf_vit_from_timm(reference, loaded)
    mean, std = torch.tensor(loaded.transform.mean).view(3, 1, 1), torch.tensor(loaded.transform.std).view(3, 1, 1)
    params = dict(head_fusion="mean", discard_ratio=0.9)   # VITAttentionRollout's defaults

    def theirs():
        # vit_explain.py's steps: read, resize to 224, normalise, forward with attentions, rollout, overlay
        img = Image.open(PHOTO).convert("RGB")
        small = img.resize((224, 224))
        pixels = ((torch.from_numpy(np.asarray(small, np.float32) / 255).permute(2, 0, 1) - mean) / std)[None]
        with torch.inference_mode(), bench.amp():
            attentions = hf(pixel_values=pixels.to(bench.device), output_attentions=True).attentions
        # vit-explain's hook keeps each attention with .cpu(); float() because its rollout is fp32
        mask = jacobgil_rollout([a.cpu().float() for a in attentions], params["discard_ratio"], params["head_fusion"])
        bgr = np.asarray(img)[:, :, ::-1]
        return show_mask_on_image(bgr, cv2.resize(mask, (bgr.shape[1], bgr.shape[0])))

    def ours():   # the session traces under bf16 autocast on CUDA by itself
        run = ModelRun(loaded, read_image(PHOTO, target_size=decode_side([loaded])))
        return run.map_view("rollout", **params)

    pixels = loaded.preprocess(Image.open(PHOTO).convert("RGB"))
    with torch.inference_mode():
        same_logits(loaded.model(pixels), hf(pixel_values=pixels).logits, "ViT-B/16 vs transformers")
    t = bench.time({"vitviz": ours, "theirs": theirs})
    size = "x".join(map(str, Image.open(PHOTO).size))
    report(f"explain pipeline ViT-B/16 on one {size} photo: vitviz (read, trace, rollout, overlay) {t['vitviz']}, "
           f"transformers eager + vit-explain rollout + OpenCV overlay {t['theirs']}, "
           + verdict("pipeline", t["vitviz"].median / t["theirs"].median))


# ---- 5 and 6: the app's model request, and a re-render ------------------------------------------------

def request(bench: Bench, items: set[str]) -> None:
    app = bench.app
    photo = {"path": str(bench.jpeg)}
    megapixels = Image.open(bench.jpeg).width * Image.open(bench.jpeg).height / 1e6
    for what, (a, b) in (("ImageNet pair (ViT-B/16 + CvT-13)", bench.imagenet_pair),
                         (bench.bundled_pair[2], bench.bundled_pair[:2])):
        models = [app.gpu.load_model(name) for name in (a, b)]
        inputs = [m.preprocess(Image.open(PHOTO).convert("RGB")) for m in models]
        keys = []

        def click():
            keys.append(app.page.explain(photo, a, b, progress=lambda *args, **kwargs: None).key)

        def forward(i: int):
            with torch.inference_mode(), bench.amp():   # the request runs as the server runs it, bare
                return models[i].model(inputs[i])

        t = bench.time({"request": click, "a": lambda: forward(0), "b": lambda: forward(1),
                        "decode": lambda: read_image(bench.jpeg, target_size=decode_side(models))})
        forwards = t["a"].median + t["b"].median
        decoded = read_image(bench.jpeg, target_size=decode_side(models)).size
        if "request" in items:
            report(f"app request {megapixels:.0f} MP JPEG, {what}: request {t['request']} (of which JPEG decode to "
                   f"{decoded[0]}x{decoded[1]} {_ms(t['decode'].median)} ms), plain forwards {_ms(t['a'].median)} + "
                   f"{_ms(t['b'].median)} ms, " + verdict("request", t["request"].median / forwards))
        if "rerender" in items:
            key = keys[-1]
            r = bench.time({"layers": lambda: app.attention.render_layers(key, 2, 1, 2, 0, None, "row"),
                            "maps": lambda: app.page.render_maps(key, "viridis", "nearest", "heatmap", True)})
            for name, action in (("layers", "layer/head slider"), ("maps", "colour map")):
                report(f"app re-render ({action}), {what}: {r[name]} vs request {_ms(t['request'].median)} ms, "
                       + verdict("rerender", r[name].median / t["request"].median))


# ---- 7 and 8: the launched app: cold start, memory ----------------------------------------------------

def launched_app(bench: Bench, items: set[str]) -> None:
    """`python app.py` from process start: when the page is first served, when the first Explain (sent as soon
    as the page is) is answered, and what the next requests take; for the ImageNet pair, its memory."""
    from app_server import launch
    from gradio_client import Client, handle_file

    pairs = {"ImageNet pair (ViT-B/16 + CvT-13) from folders": bench.imagenet_pair}
    if "coldstart" in items:
        pairs[bench.bundled_pair[2]] = bench.bundled_pair[:2]
        imports = import_seconds()
        report(f"start-up imports, fresh interpreters taking turns: import app {imports['app']}, import gradio, torch "
               f"{imports['gradio, torch']}, " + verdict("import", imports["app"].median / imports["gradio, torch"].median))
    photo = handle_file(str(bench.jpeg))   # made before any clock starts: it takes seconds
    for what, (a, b) in pairs.items():
        memory = "memory" in items and what.startswith("ImageNet")
        requests = max(1 + (2 if bench.quick else WARM_REQUESTS), (3 if bench.quick else APP_REQUESTS) if memory else 0)
        start = time.perf_counter()
        server = launch(bench.folder("app"), "--vit", a, "--cvt", b)
        page = time.perf_counter() - start
        try:
            client = Client(server.url, verbose=False, analytics_enabled=False,
                            download_files=str(bench.folder("app-downloads")))
            connect = time.perf_counter() - start - page
            seconds = []
            for i in range(requests):
                t0 = time.perf_counter()
                client.predict(photo, a, b, api_name="/explain")
                seconds.append(time.perf_counter() - t0)
                if i == 0:
                    first = time.perf_counter() - start
            status = Path(f"/proc/{server.process.pid}/status").read_text().splitlines()
            status = dict(line.split(":", 1) for line in status)
        finally:
            server.stop()
        warm = Timing(seconds[1:])
        if "coldstart" in items:
            loaded = load_seconds((a, b))
            floor = loaded + warm.median
            report(f"cold start python app.py, {what}: first page {page:.1f} s, first answered request {first:.1f} s "
                   f"(the client's connection to the page {connect:.2f} s of it), warm requests {warm}, "
                   f"(first answer - first page) / warm request "
                   + verdict("coldstart", (first - page) / warm.median)
                   + f"; floor: import gradio, torch and both models loaded in a fresh process {loaded:.1f} s + one "
                     f"warm request = {floor:.1f} s, first answer / floor " + verdict("coldstart-floor", first / floor))
        if memory:
            gib = lambda key: int(status[key].split()[0]) * 1024 / 2**30
            report(f"app memory, ImageNet pair, after {len(seconds)} requests over HTTP: RSS {gib('VmRSS'):.2f} GiB, "
                   f"peak RSS {gib('VmHWM'):.2f} GiB (requests from a client: {warm})")


def load_seconds(names) -> float:
    """Seconds from starting a fresh interpreter to both models in memory: `import gradio, torch`, then vitviz's
    `hub.load` of each (read when the process says so, not at its exit): with one warm request, the floor of
    the first answer after a start."""
    code = ("import gradio, torch\nfrom vitviz import hub\n"
            + "".join(f"hub.load({name!r}, allow_local=True)\n" for name in names) + "print('loaded', flush=True)\n")
    start = time.perf_counter()
    with subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}) as process:
        line = process.stdout.readline()
        seconds = time.perf_counter() - start
        process.wait()
    if line.strip() != "loaded":
        raise SystemExit(f"coldstart: loading {names} in a fresh process failed")
    return seconds


def import_seconds(rounds: int = 5) -> dict[str, Timing]:
    """Seconds to import the app, and its floor (gradio and torch, which it cannot start without), each in a fresh
    interpreter, the two taking turns so that a busy moment of the machine falls on both."""
    code = {"app": "import app", "gradio, torch": "import gradio, torch"}
    seconds = {name: [] for name in code}
    for _ in range(rounds):
        for name, statement in code.items():
            timed = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
            done = subprocess.run([sys.executable, "-c", timed], cwd=ROOT, capture_output=True, text=True, check=True,
                                  env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
            seconds[name].append(float(done.stdout.split()[-1]))
    return {name: Timing(values) for name, values in seconds.items()}


# ---- 9: the machine's limit ------------------------------------------------------------------------------

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


def peak(bench: Bench, items: set[str]) -> None:
    sizes = (256, 512) if bench.quick else (4096, 8192) if bench.device.type == "cuda" else (1024, 2048)
    dtype = torch.bfloat16 if bench.autocast else torch.float32
    rates = {}
    for n in sizes:   # the best of many square products: a peak, not a typical speed
        x, y = (torch.randn(n, n, device=bench.device, dtype=dtype) for _ in range(2))
        best = min(timed({"mm": lambda: torch.mm(x, y)}, repeats=max(bench.repeats, 5) * 3, warmup=bench.warmup,
                         clock=CLOCKS[bench.clock])["mm"].seconds)
        rates[n] = 2 * n ** 3 / best / 1e9
    n, gflops = max(rates.items(), key=lambda item: item[1])
    reference, loaded = bench.vit_base
    parts = []
    for batch in bench.batches:
        seconds = bench.results.get(("forward", "vit_base_patch16_224", batch))
        if seconds is None:
            pixels = torch.randn(batch, 3, 224, 224, device=bench.device)
            with torch.inference_mode(), bench.amp():
                seconds = bench.time({"f": lambda: loaded.model(pixels)})["f"].median
        work = vit_flops(loaded.model.config, batch) / 1e9
        parts.append(f"b{batch} {work:.1f} GFLOP in {_ms(seconds)} ms = {work / seconds:.0f} GFLOP/s, "
                     f"{work / seconds / gflops:.0%} of peak")
    report(f"machine peak {'bf16' if bench.autocast else 'fp32'} matmul {gflops:.0f} GFLOP/s ({n}x{n}, "
           f"{torch.cuda.get_device_name() if bench.device.type == 'cuda' else f'{torch.get_num_threads()} threads'}); "
           f"vitviz vit_base_patch16_224 forward (median): " + "; ".join(parts))


# ---- attribution: the explanation methods against their reference packages --------------------------------

@dataclass
class Duel:
    """One vitviz method and a reference package's implementation of it, timed on the same weights and input."""
    method: str       # the vitviz.explain name
    peer: str         # the reference, as the line names it
    ours: Timing
    theirs: Timing


def same_map(ours: np.ndarray, theirs: np.ndarray, what: str, *, tol: float) -> None:
    """Refuse to time two implementations that do not compute the same map."""
    error = float(np.abs(ours - theirs).max())
    if not error <= tol:
        raise SystemExit(f"{what}: the two maps disagree (max difference {error:.3g} > {tol:g}): not timed")


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


# each (bench, pixels, target class) -> Duel (None: none on this device); one that must not share this process (lxt patches torch classes
# process-wide) times its reference in a subprocess of its own and returns that Timing
DUELS = (legrad_vs_torchcam, gradcam_vs_grad_cam, attnlrp_vs_lxt)


def attribution(bench: Bench, items: set[str]) -> None:
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
               f"{in_forwards(d.theirs)} (vitviz forward {_ms(forward.median)} ms), "
               + verdict("attribution", d.ours.median / d.theirs.median))


# ---- issue 15: faithfulness over a data set, and batch explain --------------------------------------------

def photos(count: int, size: tuple[int, int]) -> list[Image.Image]:
    """`count` different photos of `size` (w, h): the example photo turned a little more each time."""
    photo = Image.open(PHOTO).convert("RGB").resize(size, Image.BICUBIC)
    return [photo.rotate(7 * i) for i in range(count)]


def per_image_forward(bench: Bench, model: torch.nn.Module, batch: int, size: tuple[int, int]) -> float:
    """Seconds per image of a batched forward of `batch` images: the floor of anything that must forward them."""
    pixels = torch.randn(batch, 3, *size, device=bench.device)
    with torch.inference_mode():
        return bench.time({"forward": lambda: model(pixels)})["forward"].median / batch


def evaluate_floor(bench: Bench, items: set[str]) -> None:
    """`vitviz evaluate` (every method, all five tests) on the bundled pair against its floor: the images it
    sends through each model (counted by a forward hook) times one image's share of a batched forward."""
    from vitviz.data import Dataset
    from vitviz.evaluate import Settings, evaluate
    from vitviz.explain import METHODS

    vit, cvt, what = bench.bundled_pair
    settings = Settings(batch_size=8, forward_batch=64, steps=4, regions=8) if bench.quick else Settings()
    settings = settings.on(bench.device)
    images = photos(16 if bench.quick else 64, (32, 32))
    data = Dataset(name="bench photos", ids=tuple(map(str, range(len(images)))), labels=None, classes=None,
                   source=images.__getitem__)
    loaded = [vitviz.load(name, device=bench.device) for name in (vit, cvt)]
    forwarded = {m.name: 0 for m in loaded}

    def count(name):
        return lambda module, args: forwarded.__setitem__(name, forwarded[name] + args[0].shape[0])

    hooks = [m.model.register_forward_pre_hook(count(m.name)) for m in loaded]
    seconds = []
    try:
        for r in range(max(1, bench.repeats // 3)):   # minutes per round on a CPU: fewer rounds
            forwarded.update(dict.fromkeys(forwarded, 0))
            start = CLOCKS[bench.clock]()
            with contextlib.redirect_stdout(io.StringIO()):   # the table: not a benchmark line
                evaluate(models=[vit, cvt], data=data, out=bench.folder(f"evaluate-{r}"), settings=settings,
                         device=str(bench.device), progress=False)
            seconds.append(CLOCKS[bench.clock]() - start)
    finally:
        for hook in hooks:
            hook.remove()
    per_image = {m.name: per_image_forward(bench, m.model, settings.forward_batch, m.transform.crop) for m in loaded}
    floor = sum(forwarded[name] * per_image[name] for name in forwarded)
    total = Timing(seconds)
    report(f"evaluate {len(images)} images, {what}, {len(METHODS)} methods + random, 5 tests: {total} "
           f"for {sum(forwarded.values())} images through the models; floor (each image's share of a batched forward "
           f"of {settings.forward_batch}) {_ms(floor)} ms, " + verdict("evaluate", total.median / floor))


def quantus_region(bench: Bench, items: set[str]) -> None:
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
           f"quantus RegionPerturbation {t['quantus']}, " + verdict("quantus", t["vitviz"].median / t["quantus"].median))


# ---- issue 25: CLIP against open_clip and legrad_torch -------------------------------------------------------

def clip(bench: Bench, items: set[str]) -> None:
    """CLIP ViT-B/16 with QuickGELU (OpenAI's shape; random weights in open_clip's Hub layout, through
    `vitviz.load`): image features against open_clip 3.3's `encode_image`, text features of 8 prompts against
    `encode_text`, and LeGrad-CLIP (3 prompts, one image, the last two blocks) against legrad_torch 1.1's
    `compute_legrad_clip` as tests/test_clip.py writes it out on open_clip's modules, with its hooks and frozen
    early blocks (legrad_torch itself needs open_clip <= 2.23, which cannot share this venv)."""
    import copy
    import open_clip
    import torch.nn.functional as F
    from test_clip import (TINY_NAMES, Hooked, legrad_torch_compute_legrad_clip, min_max, register_tiny_clips,
                           save_open_clip)
    from test_models import VIT_STD, perturb_
    from vitviz import explain

    shape = "ViT-B-16-quickgelu"   # the lines name it; --quick runs a tiny CLIP of the same kind
    if bench.quick:
        register_tiny_clips(bench.folder("open-clip-configs"))
    config = TINY_NAMES["quick_gelu"] if bench.quick else shape
    torch.manual_seed(0)
    reference = perturb_(open_clip.create_model(config, pretrained=None), std=VIT_STD)
    loaded = vitviz.load(str(save_open_clip(reference, config, bench.folder(config), timm_config=False)),
                         device=bench.device)
    reference = reference.to(bench.device)
    size = loaded.size
    for batch in bench.batches:
        pixels = torch.randn(batch, 3, size, size, device=bench.device)
        with torch.inference_mode():
            same_logits(loaded.image_features(pixels), reference.encode_image(pixels), f"{shape} image features")
            with bench.amp():
                t = bench.time({"vitviz": lambda: loaded.image_features(pixels),
                                "open_clip": lambda: reference.encode_image(pixels)})
        report(f"clip image features b{batch} {shape}: vitviz {t['vitviz']}, open_clip encode_image {t['open_clip']}, "
               + verdict("clip", t["vitviz"].median / t["open_clip"].median))
    prompts = [f"a photo of a {word}" for word in ("dog", "cat", "ball", "grass", "tree", "car", "sky", "person")]
    ids = loaded.tokenize(prompts)
    with torch.inference_mode():
        same_logits(loaded.clip.text_features(ids), reference.encode_text(ids), f"{shape} text features")
        with bench.amp():
            t = bench.time({"vitviz": lambda: loaded.clip.text_features(ids),
                            "open_clip": lambda: reference.encode_text(ids)})
    report(f"clip text features {len(prompts)} prompts {shape}: vitviz {t['vitviz']}, open_clip encode_text "
           f"{t['open_clip']}, " + verdict("clip", t["vitviz"].median / t["open_clip"].median))
    classifier, image = loaded.with_prompts(prompts[:3]), torch.randn(1, 3, size, size, device=bench.device)
    with torch.no_grad():
        text_embedding = F.normalize(reference.encode_text(ids[:3]), dim=-1)
    hooked = Hooked(copy.deepcopy(reference), -2)
    params = explain.METHODS["legrad"].params_for(True)
    ours = lambda: explain.legrad(classifier.model, image.repeat(3, 1, 1, 1), [0, 1, 2], **params)
    theirs = lambda: legrad_torch_compute_legrad_clip(hooked, image, text_embedding)
    upsampled = min_max(F.interpolate(ours()[None], scale_factor=loaded.model.config.patch_size, mode="bilinear"))
    same_map(upsampled.cpu().numpy(), theirs().detach().cpu().numpy(), "LeGrad-CLIP", tol=1e-4)
    t = bench.time({"vitviz": ours, "legrad_torch": theirs})
    report(f"clip legrad 1 image x 3 prompts {shape}: vitviz {t['vitviz']}, legrad_torch's algorithm "
           f"{t['legrad_torch']}, " + verdict("clip-legrad", t["vitviz"].median / t["legrad_torch"].median))


def batch_explain(bench: Bench, items: set[str]) -> None:
    """`python -m vitviz explain` on the bundled pair (rollout, the command's defaults), in process: images
    per second writing maps as .npy only and writing every PNG too (both without the deletion/insertion curves,
    which are forwards of their own), and .npy with the default curves. Wall clock whatever --clock says (the
    drawing and encoding run on a thread pool, whose gain a CPU clock would not show); one sample each."""
    from vitviz import __main__ as cli

    vit, cvt, what = bench.bundled_pair
    folder = bench.folder("explain-photos")
    count, size = (8, (320, 240)) if bench.quick else (48, (640, 480))
    for i, photo in enumerate(photos(count, size)):
        photo.save(folder / f"photo-{i:02d}.jpg", quality=90)
    rates = {}
    for name, options in {"npy": ["--formats", "npy", "--faithfulness-steps", "0"],
                          "png": ["--formats", "png", "npy", "--faithfulness-steps", "0"],
                          "npy+auc": ["--formats", "npy"]}.items():
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.main(["explain", str(folder), "--models", vit, cvt, "--device", str(bench.device),
                      "--out", str(bench.folder(f"explain-{name}")), *options])
        rates[name] = count / (time.perf_counter() - start)
    met = {k: "OK" if rates[k] >= EXPLAIN_IMAGES_S else "MISSED" for k in ("npy", "png")}
    report(f"batch explain {count} photos {size[0]}x{size[1]}, {what}, wall clock: --formats npy {rates['npy']:.1f} "
           f"images/s (target >= {EXPLAIN_IMAGES_S}) {met['npy']}; --formats png npy {rates['png']:.1f} images/s "
           f"(target >= {EXPLAIN_IMAGES_S}) {met['png']}, npy alone {rates['npy'] / rates['png']:.1f}x faster; with "
           f"the default --faithfulness-steps 8 {rates['npy+auc']:.1f} images/s")


# ---- issue 24: what decides ---------------------------------------------------------------------------------

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
    for l, block in enumerate(reference.blocks):
        for j in range(inputs[0].shape[1]):
            def patch(module, args, l=l, j=j):
                x = args[0].clone()
                x[:, j] = inputs[l][:, j]
                return (x,)
            hook = block.register_forward_pre_hook(patch)
            effects[l, j] = (metric(reference(corrupted)) - m_corrupted) / (m_clean - m_corrupted)
            hook.remove()
    return effects


def decide(bench: Bench, items: set[str]) -> None:
    """Direct logit attribution with token effects (ViT-B/16 and CvT-13, batch 1) against a traced forward;
    residual patching of every block and position of ViT-Ti/16 at 112 px (12 x 50 patched images; at 224 px the
    hooks alone take minutes a round on a CPU) against its floor, the same batched forwards from each block on
    without building the patched batches, and against forward hooks on timm's blocks, one position per forward."""
    from vitviz import explain

    for name, (_, loaded) in (("vit_base_patch16_224", bench.vit_base), ("CvT-13", bench.cvt_13)):
        model = loaded.model
        pixels = torch.randn(1, 3, 224, 224, device=bench.device)
        with torch.no_grad():
            t = bench.time({"dla": lambda: explain.direct_logit_attribution(model, model.trace(pixels, decompose=True)),
                            "traced": lambda: model.trace(pixels)})
        report(f"decide attribution b1 {name}: trace + direct logit attribution + token effects {t['dla']}, traced "
               f"forward {t['traced']}, " + verdict("decide", t["dla"].median / t["traced"].median))

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
           + verdict("decide-floor", t["vitviz"].median / t["floor"].median)
           + f"; timm forward hooks one position per forward {t['timm']}, "
           + verdict("decide-hooks", t["vitviz"].median / t["timm"].median))


def timm_vision_transformer(model) -> torch.nn.Module:
    """timm's `VisionTransformer` holding a vitviz ViT's weights (timm's names, so they load 1:1, strictly)."""
    from timm.models.vision_transformer import VisionTransformer

    c = model.config
    reference = VisionTransformer(img_size=c.img_size, patch_size=c.patch_size, in_chans=c.in_chans,
                                  num_classes=c.num_classes, embed_dim=c.embed_dim, depth=c.depth, num_heads=c.num_heads,
                                  mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias, class_token=c.class_token,
                                  reg_tokens=c.reg_tokens, no_embed_class=c.no_embed_class, global_pool=c.global_pool,
                                  fc_norm=c.fc_norm, init_values=c.init_values)
    reference.load_state_dict(model.state_dict())
    return reference.eval()


def compare_cka(bench: Bench, items: set[str]) -> None:
    """`vitviz.compare` over 256 images of the bundled pair in batches of 64 (from PIL images: each model's
    preprocessing, traced forward without attention maps, block features, HSIC_1 sums) against those traced
    forwards alone on the
    same batches (tokens=mean, the default); and with tokens=flat, from the same pixels, against pytorch-cka
    1.1.3's `compute_cka`: forward hooks on the blocks of timm's `VisionTransformer` holding the bundled ViT's
    weights, and of the bundled CvT (timm has no CvT). Not our ViT's plain forward: that computes only the
    class token in its last block, so hooked there pytorch-cka would measure that block on one token of 65
    and do less work than the comparison needs. Every row is checked equal before the timing."""
    from cka import compute_cka

    from vitviz import compare

    vit, cvt, what = bench.bundled_pair
    loaded = [vitviz.load(name, device=bench.device) for name in (vit, cvt)]
    count, size = (32, 16) if bench.quick else (256, 64)
    images = photos(count, (32, 32))
    cut = compare.batches(range(count), size)
    pixels = [[torch.cat([m.preprocess(images[i]) for i in batch]) for m in loaded] for batch in cut]

    def traced():
        with torch.inference_mode():
            for batch in pixels:
                for m, p in zip(loaded, batch):
                    m.model.trace(p, attention=False)

    def ours_flat():
        acc = compare.LayerCKA()
        with torch.inference_mode():
            for a, b in pixels:
                acc.add_traces(loaded[0].model.trace(a, attention=False), loaded[1].model.trace(b, attention=False),
                               tokens="flat")
        return acc.result()

    layers = [[f"blocks.{i}" for i in range(len(loaded[0].model.blocks))],
              [f"stages.{s}.blocks.{j}" for s, stage in enumerate(loaded[1].model.stages) for j in range(len(stage.blocks))]]

    timm_vit = timm_vision_transformer(loaded[0].model).to(bench.device)

    def theirs():
        return compute_cka(timm_vit, loaded[1].model, [[a for a, _ in pixels]], layers=layers[0],
                           model2_layers=layers[1], device=bench.device, progress=False)[0]

    if not all(torch.equal(a, b) for a, b in pixels):
        raise SystemExit("compare: the bundled pair's preprocessing differs; pytorch-cka feeds both models one input")
    ours, reference = np.clip(ours_flat().a_vs_b, 0, 1), theirs().double().cpu().numpy()
    if not np.abs(ours - reference).max() <= 1e-3:
        raise SystemExit(f"compare: vitviz and pytorch-cka disagree (max {np.abs(ours - reference).max():.3g}): not timed")
    t = bench.time({"compare": lambda: compare.cka_of_images(loaded, images, tokens="mean", batch_size=size),
                    "traced": traced})
    report(f"compare {count} images, {what}, tokens=mean: vitviz {t['compare']}, its traced forwards {t['traced']}, "
           + verdict("compare", t["compare"].median / t["traced"].median))
    t = bench.time({"vitviz": ours_flat, "pytorch-cka": theirs})
    report(f"compare {count} images, {what}, tokens=flat: vitviz {t['vitviz']}, pytorch-cka compute_cka on timm's "
           f"ViT and vitviz's CvT {t['pytorch-cka']}, " + verdict("compare-cka", t["vitviz"].median / t["pytorch-cka"].median))


# ---- issue 29: Swin ------------------------------------------------------------------------------------------

def timm_family(bench: Bench, name: str, quick_args: dict):
    """(timm model, vitviz LoadedModel) with the same random weights (BatchNorm statistics moved off their initial
    values), through timm's Hub layout."""
    import timm
    from timm.models import save_for_hf

    torch.manual_seed(0)
    reference = timm.create_model(name, pretrained=False, **(quick_args if bench.quick else {})).eval()
    with torch.no_grad():
        for key, buffer in reference.named_buffers():
            if key.endswith(("running_mean", "running_var")):
                buffer.copy_(torch.rand_like(buffer) * 0.5 + (0.75 if key.endswith("var") else -0.25))
    folder = bench.folder(name)
    if not (folder / "model.safetensors").is_file():
        save_for_hf(reference, str(folder), safe_serialization=True)
    return reference.to(bench.device), vitviz.load(str(folder), device=bench.device)


def trace_bytes(trace) -> tuple[int, int]:
    """(bytes of every tensor a trace keeps, each storage once; bytes of its attention tensors)."""
    seen, total = set(), 0

    def count(t):
        nonlocal total
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    for block in trace.blocks:
        for t in (block.attn, block.tokens, block.inputs, block.normed):
            count(t)
    for t in (trace.logits, trace.pooled, trace.final_tokens, *trace.features):
        count(t)
    attention = sum(b.attn.numel() * b.attn.element_size() for b in trace.blocks if b.attn is not None)
    return total, attention


def swin(bench: Bench, items: set[str]) -> None:
    """Swin-T (random weights, timm's layout) against timm: the forward at b1 and b8, the traced forward against
    timm's plain one, rollout to the stage-1 grid against a traced forward (never a dense product), and the memory
    the trace keeps against the sum of its windowed attention tensors."""
    from vitviz import explain

    quick = dict(embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 1, 2, 2))
    reference, loaded = timm_family(bench, "swin_tiny_patch4_window7_224", quick)
    for batch in bench.batches:
        t = against_timm(bench, loaded, reference, torch.randn(batch, 3, 224, 224, device=bench.device), "Swin-T")
        report(f"swin forward b{batch} Swin-T: vitviz {t['vitviz']}, timm {t['timm']}, "
               + verdict("swin", t["vitviz"].median / t["timm"].median))
        report(f"swin traced b{batch} Swin-T: vitviz trace {t['traced']}, timm plain {t['timm']}, "
               + verdict("swin-traced", t["traced"].median / t["timm"].median))
    pixels = torch.randn(1, 3, 224, 224, device=bench.device)
    with torch.inference_mode():
        trace = loaded.model.trace(pixels)
        t = bench.time({"rollout": lambda: explain.attention_rollout(trace, to_stage=0),
                        "traced": lambda: loaded.model.trace(pixels)})
    report(f"swin rollout to stage 1 b1 Swin-T: {t['rollout']}, traced forward {t['traced']}, "
           + verdict("swin-rollout", t["rollout"].median / t["traced"].median))
    kept, attention = trace_bytes(trace)
    dense = sum(4 * b.tokens.shape[1] ** 2 * b.heads for b in trace.blocks)
    report(f"swin trace memory b1 Swin-T 224 px: {kept / 2**20:.1f} MiB kept, windowed attention {attention / 2**20:.1f} "
           f"MiB (dense token x token matrices would be {dense / 2**20:.0f} MiB), " + verdict("swin-memory", kept / attention))


# ---- issue 30: the CNN baseline -------------------------------------------------------------------------------

def cnn(bench: Bench, items: set[str]) -> None:
    """ResNet-50 and ConvNeXt-T (random weights, BatchNorm statistics moved; timm's layout) against timm: the
    forward at b1 and b8 and the traced forward; and every block's receptive field of one image against the same
    gradients taken with hooks and autograd on timm's model (as `tests/test_receptive.py` writes them)."""
    from test_receptive import hooked_fields
    from vitviz import explain

    cases = {"resnet50": dict(layers=(1, 1, 1, 1)), "convnext_tiny": dict(depths=(1, 1, 1, 1), dims=(16, 24, 32, 40))}
    for name, quick in cases.items():
        reference, loaded = timm_family(bench, name, quick)
        for batch in bench.batches:
            t = against_timm(bench, loaded, reference, torch.randn(batch, 3, 224, 224, device=bench.device), name)
            report(f"cnn forward b{batch} {name}: vitviz {t['vitviz']}, timm {t['timm']}, "
                   + verdict("cnn", t["vitviz"].median / t["timm"].median))
            report(f"cnn traced b{batch} {name}: vitviz trace {t['traced']}, timm plain {t['timm']}, "
                   + verdict("cnn-traced", t["traced"].median / t["timm"].median))
        size = 64 if bench.quick else 224
        pixels = torch.randn(1, 3, size, size, device=bench.device)
        found = explain.receptive_field(loaded.model, pixels)
        trace = loaded.model.trace(pixels)
        tokens = []
        for i in found.blocks:
            index = explain.receptive.centre_token(trace, i)[0]
            tokens.append(divmod(index, trace.blocks[i].query_grid[1]))
        blocks = ([b for stage in (reference.layer1, reference.layer2, reference.layer3, reference.layer4)
                   for b in stage] if name == "resnet50" else [b for stage in reference.stages for b in stage.blocks])
        theirs = hooked_fields(reference, blocks, pixels, tokens, "bchw")
        if not torch.allclose(theirs, found.maps, rtol=0, atol=1e-4 * float(found.maps.max())):
            raise SystemExit(f"cnn: {name}'s receptive fields differ from timm's: not timed")
        t = bench.time({"vitviz": lambda: explain.receptive_field(loaded.model, pixels),
                        "hooks": lambda: hooked_fields(reference, blocks, pixels, tokens, "bchw")})
        report(f"cnn receptive fields {len(found.blocks)} blocks b1 {name}: vitviz {t['vitviz']}, timm hooks + "
               f"autograd.grad {t['hooks']}, " + verdict("cnn-receptive", t["vitviz"].median / t["hooks"].median))


# ---- issue 31: video --------------------------------------------------------------------------------------------

def video(bench: Bench, items: set[str]) -> None:
    """`vitviz.video.explain_video` (decode, both models, rollout, drawing, H.264 encoding) on a 640x480 clip of
    the example photo panning, against the same frames' batched traced forwards alone (the frames decoded once,
    beforehand): frames per second of each, and their ratio (time end to end / time of the forwards)."""
    import av

    from vitviz import video as clips

    count = 8 if bench.quick else 48
    path = bench.tmp / "pan.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
        photo = Image.open(PHOTO).convert("RGB").resize((960, 480))
        for k in range(count * 3):   # sampled at 8 of its 24 frames a second
            frame = np.asarray(photo.crop((k * 4, 0, k * 4 + 640, 480)))
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    pairs = {"bundled pair": bench.bundled_pair[:2], "ImageNet pair": bench.imagenet_pair}
    for what, names in pairs.items():
        models = [vitviz.load(n, device=bench.device) for n in names]
        frames = [f.image for f in clips.read_frames(path, fps=8, resize=max(
            m.transform.resize if isinstance(m.transform.resize, int) else max(m.transform.resize) for m in models))]
        pixels = [[torch.cat([m.transform(f) for f in frames[i:i + 8]]).to(bench.device) for i in range(0, len(frames), 8)]
                  for m in models]

        def forwards():
            with torch.inference_mode():
                for m, batches in zip(models, pixels):
                    for p in batches:
                        m.model.trace(p)
        out = bench.folder(f"video-{what}")
        t = bench.time({"video": lambda: clips.explain_video(path, models, methods=["rollout"], out=out, fps=8),
                        "forwards": forwards})
        with av.open(str(out / clips.VIDEO_FILE)) as container:   # what it wrote: the side-by-side frames
            written = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]

        def encode():   # the H.264 encoding alone, part of end to end's time that no model choice changes
            writer = clips.VideoWriter(bench.tmp / "encoded.mp4", fps=8)
            for image in written:
                writer.write(image)
            writer.close()
        encoding = bench.time({"encode": encode})["encode"]
        rate, floor = len(frames) / t["video"].median, len(frames) / t["forwards"].median
        report(f"video {len(frames)} frames 640x480, {what}: end to end {rate:.1f} frames/s ({t['video']}), the batched "
               f"traced forwards alone {floor:.1f} frames/s ({t['forwards']}), of end to end the H.264 encoding of its "
               f"{written[0].shape[1]}x{written[0].shape[0]} frames alone {encoding.median / len(written) * 1000:.1f} ms a "
               f"frame, " + verdict("video", t["video"].median / t["forwards"].median))


# ---- main ---------------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny models and images, few repeats (a smoke test)")
    p.add_argument("--only", nargs="+", choices=ITEMS, metavar="ITEM", help=f"some of: {' '.join(ITEMS)}")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per measurement (default 7; 2 quick)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--clock", choices=list(CLOCKS), default="wall",
                   help="cpu: time in-process items by this process's CPU time (with --threads 1, a shared "
                        "machine's other jobs then do not count; cold start and HTTP requests stay wall time)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--autocast", action="store_true", help="bf16 autocast around every timed forward (GPU runs)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes of items 1-3 and 9")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this machine has no CUDA device")
    if args.clock == "cpu" and args.device == "cuda":
        p.error("--clock cpu cannot see GPU time: use the wall clock on CUDA")
    if args.threads:
        torch.set_num_threads(args.threads)
    items = set(args.only or ITEMS)
    repeats = args.repeats or (2 if args.quick else 7)
    if repeats < 1:
        p.error("--repeats must be at least 1")
    # running or runnable ones only: a training paused for a quiet window (kill -STOP) takes no CPU
    training = subprocess.run(["pgrep", "-r", "R,S,D", "-f", "vitviz.train"], capture_output=True,
                              text=True).stdout.split()
    report(f"vitviz benchmark: torch {torch.__version__}, {args.device}"
           f"{' (' + torch.cuda.get_device_name() + ')' if args.device == 'cuda' else ''}"
           f"{', bf16 autocast' if args.autocast else ''}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
           f"{args.clock} clock, "
           f"repeats {repeats}{', quick (tiny models)' if args.quick else ''}"
           f"{f', {len(training)} training processes running (numbers slowed)' if training else ''}")
    with tempfile.TemporaryDirectory(prefix="vitviz-bench-") as tmp:
        bench = Bench(quick=args.quick, repeats=repeats, tmp=Path(tmp), device=torch.device(args.device),
                      autocast=args.autocast, clock=args.clock, batches=tuple(args.batches))
        steps = [({"forward", "traced"}, vit_forward), ({"cvt"}, cvt_forward), ({"pipeline"}, pipeline),
                 ({"request", "rerender"}, request), ({"coldstart", "memory"}, launched_app), ({"peak"}, peak),
                 ({"attribution"}, attribution), ({"evaluate"}, evaluate_floor), ({"quantus"}, quantus_region),
                 ({"explain"}, batch_explain), ({"decide"}, decide), ({"compare"}, compare_cka), ({"clip"}, clip),
                 ({"swin"}, swin), ({"cnn"}, cnn), ({"video"}, video)]
        for wanted, step in steps:
            if wanted & items:
                step(bench, items)


if __name__ == "__main__":
    main()
