"""Item 4: the explain pipeline a user would otherwise write (transformers' eager ViT, jacobgil/vit-explain's
rollout and its OpenCV overlay) against vitviz's (read, trace, rollout, overlay), with its floor, and where
vitviz's time goes, stage by stage.

The floor: vitviz's pipeline runs its traced forward, so it can take no less than that forward alone, and its
ratio to the peer no less than (traced forward) / (peer's pipeline). Where that floor is above the target, the
target is out of reach while the forward runs at its speed, whatever the rest costs; the line says so. On a CPU
both forwards do the same matrix products near the machine's matmul peak (item 9, `peak`)."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from timing import Timing, ms, report, same_logits, verdict
from vitviz import explain, views
from vitviz.files import png_bytes
from vitviz.image import read_image
from vitviz.session import ModelRun, decode_side, trace_batch
from workbench import PHOTO, Bench

TARGET = 0.80


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


def measure(bench: Bench, items: set[str]) -> None:
    """ViT-B/16 on the example photo: vitviz's read, trace, rollout and overlay against transformers' eager forward
    with its attentions, vit-explain's rollout and its overlay, the two models checked to compute the same logits."""
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
        return views.map_view(run, "rollout", **params)

    pixels = loaded.preprocess(Image.open(PHOTO).convert("RGB"))
    with torch.inference_mode():
        same_logits(loaded.model(pixels), hf(pixel_values=pixels).logits, "ViT-B/16 vs transformers")
    t = bench.time({"vitviz": ours, "theirs": theirs, "trace": lambda: trace_batch(loaded, pixels)})
    size = "x".join(map(str, Image.open(PHOTO).size))
    floor = t["trace"].median / t["theirs"].median
    report(f"explain pipeline ViT-B/16 on one {size} photo: vitviz (read, trace, rollout, overlay) {t['vitviz']}, "
           f"transformers eager + vit-explain rollout + OpenCV overlay {t['theirs']}, "
           + verdict(t["vitviz"].median / t["theirs"].median, TARGET)
           + f"; floor: its traced forward alone {t['trace']}, {floor:.2f} of the peer's pipeline"
           + (", above the target: out of reach at this forward's speed" if floor > TARGET else ""))
    stages = pipeline_stages(bench, loaded, params)
    report(f"explain pipeline ViT-B/16 stages, vitviz on one {size} photo (medians): "
           + ", ".join(f"{name} {ms(timing.median)} ms" for name, timing in stages.items())
           + f"; their sum {ms(sum(timing.median for timing in stages.values()))} ms, the pipeline "
           f"{ms(t['vitviz'].median)} ms")


def pipeline_stages(bench: Bench, loaded, params: dict) -> dict[str, Timing]:
    """vitviz's explain pipeline one stage at a time, each on what the stage before made: decoding the photo,
    resizing and normalising it, the traced forward (with its copy back to the host), the map (rollout from the
    trace), the overlay (the run's canvas and the drawn view) and encoding the view as `vitviz explain` writes it
    (a PNG)."""
    side = decode_side([loaded])
    image = read_image(PHOTO, target_size=side)
    pixels = loaded.preprocess(image)
    trace = trace_batch(loaded, pixels)[0]
    method = explain.method("rollout")
    values = method.from_trace(trace, **params)[0].numpy()
    view = views.map_view(ModelRun(loaded, image, pixels=pixels, trace=trace), "rollout", values=values, **params)
    return bench.time({
        "decode": lambda: read_image(PHOTO, target_size=side),
        "resize + normalise": lambda: loaded.preprocess(image),
        "trace": lambda: trace_batch(loaded, pixels),
        "map (rollout)": lambda: method.from_trace(trace, **params)[0].numpy(),
        "overlay": lambda: views.map_view(ModelRun(loaded, image, pixels=pixels, trace=trace), "rollout",
                                          values=values, **params),
        "encode (PNG)": lambda: png_bytes(view)})
