"""CLIP through `vitviz.load`: open_clip's and transformers' Hub layouts (random perturbed weights, served by
the fake Hub or read from a folder) give open_clip's and transformers' image features, text features, logits
and pixels; timm's QuickGELU CLIP tower agrees through its own `checkpoint_filter_fn`; the tokenizer's ids are
open_clip's and transformers'; prompts make a classifier that every method explains; LeGrad for CLIP and
Chefer's CLIP relevance are their authors' algorithms (written out below from legrad_torch 1.1 and the
Transformer-MM-Explainability CLIP notebook, on open_clip's own modules).
"""
from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from open_clip.push_to_hf_hub import save_config_for_hf
from PIL import Image
from safetensors.torch import save_file

import vitviz
from hub_server import files_of
from test_explain import spearman
from test_models import VIT_STD, perturb_
from vitviz import catalog, explain
from vitviz.cli import main as cli
from vitviz.hub import LoadError, Source
from vitviz.preprocess import PROMPT_TEMPLATE, prompts_from_text

PHOTO = Path(__file__).resolve().parents[1] / "assets" / "cat_chelsea.jpg"
TOL = 1e-5
TINY = {"embed_dim": 32,
        "vision_cfg": {"image_size": 64, "layers": 3, "width": 48, "patch_size": 16, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}}
TINY_NAMES = {"quick_gelu": "vitviz-tiny-clip-quickgelu", "gelu": "vitviz-tiny-clip"}
SENTENCES = ["a photo of a dog", "A CAT, sitting on 2 mats!", "Café crème, naïve façade: 東京 & Zürich?!",
             "  spaces\tand\nnew lines  ", "it's 3:45 pm -- isn't it?"]
# timm's config.json in timm's CLIP repos (architecture and the classifier timm loads the projection as)
TIMM_CONFIG = {"architecture": "vit_base_patch16_clip_quickgelu_224", "num_classes": 32, "num_features": 48,
               "global_pool": "token", "pretrained_cfg": {"tag": "openai", "input_size": [3, 64, 64],
                                                          "crop_pct": 1.0, "interpolation": "bicubic"}}

pytestmark = pytest.mark.usefixtures("own_caches", "one_torch_thread")


def register_tiny_clips(folder) -> None:
    """The tiny CLIPs registered with open_clip, as a model config of one's own is (`add_model_config`)."""
    for act, name in TINY_NAMES.items():
        (folder / f"{name}.json").write_text(json.dumps({**TINY, "quick_gelu": act == "quick_gelu"}))
    open_clip.add_model_config(folder)


@pytest.fixture(scope="module", autouse=True)
def tiny_configs(tmp_path_factory):
    register_tiny_clips(tmp_path_factory.mktemp("open-clip-configs"))


def open_clip_model(name: str, *, seed: int = 0):
    torch.manual_seed(seed)
    return perturb_(open_clip.create_model(name, pretrained=None), std=VIT_STD)


def save_open_clip(model, name: str, folder, *, weights: str = "safetensors", timm_config: bool = True):
    """open_clip's Hub layout (`push_to_hf_hub.save_for_hf`: open_clip_config.json by its own
    `save_config_for_hf`, the state dict as open_clip_model.safetensors or open_clip_pytorch_model.bin),
    with timm's config.json beside it, as timm's CLIP repos have."""
    folder.mkdir(parents=True, exist_ok=True)
    save_config_for_hf(model, folder / "open_clip_config.json", model_config=open_clip.get_model_config(name))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if weights == "safetensors":
        save_file(state, folder / "open_clip_model.safetensors")
    else:
        torch.save(state, folder / "open_clip_pytorch_model.bin")
    if timm_config:
        (folder / "config.json").write_text(json.dumps(TIMM_CONFIG))
    return folder


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    return Image.open(PHOTO).convert("RGB")


@pytest.fixture(scope="module")
def quickgelu(tmp_path_factory):
    """(folder, open_clip model in eval mode) of the tiny QuickGELU CLIP in open_clip's layout."""
    model = open_clip_model(TINY_NAMES["quick_gelu"])
    return save_open_clip(model, TINY_NAMES["quick_gelu"], tmp_path_factory.mktemp("clip") / "tiny"), model


def features_error(loaded, reference, pixels, ids) -> dict[str, float]:
    with torch.no_grad():
        image, text = reference.encode_image(pixels), reference.encode_text(ids)
        logits = reference.logit_scale.exp() * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
        return {"image": (loaded.image_features(pixels) - image).abs().max().item(),
                "text": (loaded.text_features(SENTENCES) - text).abs().max().item(),
                "logits": (loaded.with_prompts(SENTENCES).model(pixels) - logits).abs().max().item()}


# ---- loading ----------------------------------------------------------------------------------------------

def test_an_open_clip_config_silent_on_quickgelu_takes_it_from_open_clips_registry_for_that_repo(hub, tmp_path,
                                                                                                  quickgelu):
    """open_clip's registry trains timm/vit_base_patch16_clip_224.openai with QuickGELU; a config that does not
    say loads that repo with QuickGELU and any other repo with GELU, open_clip's default."""
    folder, quick = quickgelu
    silent = json.loads((folder / "open_clip_config.json").read_text())
    del silent["model_cfg"]["quick_gelu"]
    files = {**files_of(folder), "open_clip_config.json": json.dumps(silent).encode()}
    pixels = torch.randn(2, 3, 64, 64)
    for repo_id, act in (("timm/vit_base_patch16_clip_224.openai", "quick_gelu"), ("test/silent-clip", "gelu")):
        hub.publish(repo_id, files)
        loaded = vitviz.load(repo_id, device="cpu")
        assert loaded.model.config.act == act
        with torch.no_grad():
            error = (loaded.image_features(pixels) - quick.encode_image(pixels)).abs().max()
        assert (error <= TOL) == (act == "quick_gelu")
        hub.remove(repo_id)


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_open_clip_repos_load_with_open_clips_features_logits_and_pixels(hub, tmp_path, photo, quickgelu, weights):
    folder, reference = quickgelu
    if weights == "bin":
        folder = save_open_clip(reference, TINY_NAMES["quick_gelu"], tmp_path / "bin", weights="bin")
    repo_id = f"test/tiny-clip-{weights}"
    commit = hub.publish(repo_id, files_of(folder))
    loaded = vitviz.load(repo_id, device="cpu")
    _, _, preprocess = open_clip.create_model_and_transforms(TINY_NAMES["quick_gelu"], pretrained=None)
    pixels = loaded.preprocess(photo)
    assert (pixels - preprocess(photo)[None]).abs().max() <= TOL
    pixels = torch.cat([pixels, torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))])
    errors = features_error(loaded, reference, pixels, open_clip.get_tokenizer(TINY_NAMES["quick_gelu"])(SENTENCES))
    assert max(errors.values()) <= TOL, errors
    assert loaded.takes_prompts and not loaded.has_classifier and loaded.family == "vit"
    weights_file = {"safetensors": "open_clip_model.safetensors", "bin": "open_clip_pytorch_model.bin"}[weights]
    assert loaded.source == Source("hub", repo_id, "open_clip", weights_file, "main", commit)


def test_a_folder_with_open_clips_files_alone_loads(tmp_path, quickgelu):
    _, reference = quickgelu
    folder = save_open_clip(reference, TINY_NAMES["quick_gelu"], tmp_path / "alone", timm_config=False)
    loaded = vitviz.load(str(folder), device="cpu")
    pixels = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (loaded.image_features(pixels) - reference.encode_image(pixels)).abs().max() <= TOL
    assert loaded.source.layout == "open_clip" and loaded.source.kind == "folder"


def test_the_image_tower_matches_timms_quickgelu_clip_through_timms_checkpoint_filter_fn(quickgelu):
    import timm
    from timm.models.vision_transformer import checkpoint_filter_fn

    folder, reference = quickgelu
    vision = TINY["vision_cfg"]
    timm_model = timm.create_model("vit_base_patch16_clip_quickgelu_224", pretrained=False, img_size=64,
                                   patch_size=16, embed_dim=vision["width"], depth=vision["layers"],
                                   num_heads=vision["width"] // vision["head_width"], num_classes=TINY["embed_dim"])
    timm_model.load_state_dict(checkpoint_filter_fn(reference.state_dict(), timm_model))
    loaded = vitviz.load(str(folder), device="cpu")
    pixels = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        assert (loaded.image_features(pixels) - timm_model.eval()(pixels)).abs().max() <= TOL


def test_the_activation_is_read_from_the_config_so_the_gelu_variant_does_not_match_quickgelu(tmp_path, quickgelu):
    _, quick = quickgelu
    gelu = open_clip_model(TINY_NAMES["gelu"])
    gelu.load_state_dict(quick.state_dict())   # the same weights, GELU
    loaded = vitviz.load(str(save_open_clip(gelu, TINY_NAMES["gelu"], tmp_path / "gelu")), device="cpu")
    pixels = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ours = loaded.image_features(pixels)
        assert (ours - gelu.eval().encode_image(pixels)).abs().max() <= TOL
        assert (ours - quick.encode_image(pixels)).abs().max() > 1e-3
        ids = loaded.tokenize(SENTENCES[:2])
        assert (loaded.text_features(SENTENCES[:2]) - quick.encode_text(ids)).abs().max() > 1e-3


@pytest.mark.slow   # 13 to 23 s on 2 busy cores
def test_vit_b16_quickgelu_at_its_real_shape_matches_open_clip(tmp_path):
    reference = open_clip_model("ViT-B-16-quickgelu")
    folder = save_open_clip(reference, "ViT-B-16-quickgelu", tmp_path / "b16", timm_config=False)
    loaded = vitviz.load(str(folder), device="cpu")
    assert loaded.size == 224 and loaded.model.config.act == "quick_gelu" and loaded.model.config.ln_eps == 1e-5
    ids = open_clip.get_tokenizer("ViT-B-16-quickgelu")(SENTENCES)
    errors = features_error(loaded, reference, torch.randn(2, 3, 224, 224), ids)
    assert max(errors.values()) <= TOL, errors


@pytest.fixture(scope="module")
def transformers_clip(tmp_path_factory):
    """(folder, transformers CLIPModel) in `save_pretrained`'s layout with CLIP's tokenizer files (vocab.json and
    merges.txt written from open_clip's vocabulary, as openai/clip-vit-base-patch16 ships them) and the
    preprocessor_config.json of openai/clip-vit-base-patch16."""
    from open_clip.tokenizer import SimpleTokenizer
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    config = CLIPConfig(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2),
                        vision_config=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=3, image_size=64, patch_size=16),
                        projection_dim=24)
    model = perturb_(CLIPModel(config), std=VIT_STD)
    folder = tmp_path_factory.mktemp("hf-clip")
    model.save_pretrained(folder)
    bpe = SimpleTokenizer()
    openai_names = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}   # open_clip renames them
    (folder / "vocab.json").write_text(json.dumps({openai_names.get(t, t): i for t, i in bpe.encoder.items()}))
    merges = [" ".join(pair) for pair, _ in sorted(bpe.bpe_ranks.items(), key=lambda item: item[1])]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "crop_size": 64, "do_center_crop": True, "do_normalize": True, "do_resize": True,
        "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 64}))
    return folder, model


def test_transformers_clip_loads_with_its_features_logits_pixels_and_tokenizer(hub, transformers_clip, photo):
    from transformers import CLIPImageProcessorPil, CLIPTokenizer

    folder, reference = transformers_clip
    hub.publish("test/hf-clip", files_of(folder))
    loaded = vitviz.load("test/hf-clip", device="cpu")
    processed = CLIPImageProcessorPil.from_dict(json.loads((folder / "preprocessor_config.json").read_text()))
    pixels = loaded.preprocess(photo)
    assert (pixels - processed(photo, return_tensors="pt")["pixel_values"]).abs().max() <= TOL
    tokenizer = CLIPTokenizer.from_pretrained(folder)
    ids = tokenizer(SENTENCES, padding="max_length", max_length=77, return_tensors="pt")["input_ids"]
    ours = loaded.tokenize(SENTENCES)
    written = ours != 0   # transformers pads with the end-of-text token, open_clip with zeros
    assert torch.equal(ours[written], ids[written]) and (ids[~written] == tokenizer.eos_token_id).all()
    pixels = torch.cat([pixels, torch.randn(2, 3, 64, 64)])
    with torch.no_grad():
        out = reference.eval()(input_ids=ids, pixel_values=pixels)
        assert (loaded.image_features(pixels) - reference.get_image_features(pixels).pooler_output).abs().max() <= TOL
        assert (loaded.text_features(SENTENCES) - reference.get_text_features(ids).pooler_output).abs().max() <= TOL
        assert (loaded.with_prompts(SENTENCES).model(pixels) - out.logits_per_image).abs().max() <= TOL
    assert loaded.takes_prompts and loaded.source.layout == "transformers"


def test_a_transformers_clip_with_another_vocabulary_is_refused(hub, transformers_clip):
    folder, _ = transformers_clip
    files = files_of(folder)
    vocab = json.loads(files["vocab.json"])
    vocab["dog</w>"], vocab["cat</w>"] = vocab["cat</w>"], vocab["dog</w>"]
    hub.publish("test/hf-clip-other-vocab", {**files, "vocab.json": json.dumps(vocab).encode()})
    with pytest.raises(LoadError, match="is not CLIP's byte-pair vocabulary"):
        vitviz.load("test/hf-clip-other-vocab", device="cpu")


def test_tokenizer_ids_are_open_clips_for_punctuation_capitals_digits_and_non_ascii(quickgelu):
    loaded = vitviz.load(str(quickgelu[0]), device="cpu")
    expected = open_clip.get_tokenizer("ViT-B-16")(SENTENCES)
    assert torch.equal(loaded.tokenize(SENTENCES), expected)
    assert loaded.tokenize(["a photo of a dog"])[0, :8].tolist() == [49406, 320, 1125, 539, 320, 1929, 49407, 0]


def test_prompts_from_text_splits_on_commas_and_applies_clips_template():
    assert prompts_from_text("dog, ball,, grass , dog") == ["a photo of a dog", "a photo of a ball",
                                                             "a photo of a grass"]
    assert prompts_from_text(" ,  ") == [] and PROMPT_TEMPLATE == "a photo of a {}"
    assert prompts_from_text("red car", "{}") == ["red car"]
    with pytest.raises(ValueError, match="one {}"):
        prompts_from_text("dog", "a photo")


def test_models_without_clip_take_no_prompts_and_prompts_are_checked(quickgelu):
    loaded = vitviz.load("vit-cifar10", device="cpu")
    assert not loaded.takes_prompts
    with pytest.raises(LoadError, match="takes no text prompts"):
        loaded.with_prompts(["a photo of a dog"])
    clip = vitviz.load(str(quickgelu[0]), device="cpu")
    for bad in ([], "a photo of a dog", ["a dog", "  "], [3]):
        with pytest.raises(LoadError, match="non-empty list of non-empty texts"):
            clip.with_prompts(bad)
    card = clip.card()
    assert card.takes_prompts and card.clip is None
    assert card.with_prompts(["a dog", "a cat"]).labels == ("a dog", "a cat")   # what the app's process shows
    with pytest.raises(LoadError, match="a card without weights"):
        card.text_features(["a dog"])


def test_catalog_clip_entries_are_what_loads_as_clip(hub, quickgelu, transformers_clip):
    assert catalog.PAIRS["CLIP vs supervised ViT-B/16"] == ("clip-b16", "vit-base")
    layouts = {"clip-b16": quickgelu[0], "clip-b32-laion": transformers_clip[0]}   # their real repos' layouts
    assert {n for n, e in catalog.CATALOG.items() if e.takes_prompts} == set(layouts)
    try:
        for name, folder in layouts.items():
            hub.publish(catalog.CATALOG[name].source, files_of(folder))
            assert vitviz.load(name, device="cpu").takes_prompts
    finally:
        for name in layouts:
            hub.remove(catalog.CATALOG[name].source)


# ---- prompts make a classifier that every method explains ------------------------------------------------

def test_with_prompts_is_open_clips_zero_shot_classifier_with_the_prompts_as_labels(quickgelu):
    folder, reference = quickgelu
    prompts = prompts_from_text("dog, cat, grass")
    classifier = vitviz.load(str(folder), device="cpu").with_prompts(prompts)
    pixels = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        image, text = reference(pixels, open_clip.get_tokenizer("ViT-B-16")(prompts))[:2]
        expected = reference.logit_scale.exp() * image @ text.T   # logits_per_image
        assert (classifier.model(pixels) - expected).abs().max() <= TOL
        assert (classifier.model.trace(pixels).logits - expected).abs().max() <= TOL
    assert classifier.labels == tuple(prompts) and classifier.has_classifier
    assert vitviz.load(str(folder), device="cpu").with_prompts(prompts, labels=["dog", "cat", "grass"]).labels == (
        "dog", "cat", "grass")


def test_every_method_the_faithfulness_curves_and_the_export_run_on_a_clip_model_explaining_one_prompt(quickgelu,
                                                                                                      photo):
    from vitviz.export import image_files
    from vitviz.session import ModelRun

    classifier = vitviz.load(str(quickgelu[0]), device="cpu").with_prompts(prompts_from_text("dog, cat, grass"))
    files, entry = image_files(ModelRun(classifier, photo), list(explain.METHODS), formats=["npy"],
                               faithfulness_steps=2)
    assert {f"{name}.npy" for name in explain.METHODS} <= set(files)
    assert {p["label"] for p in entry["top5"]} == set(classifier.labels)   # the prompts are the classes
    pixels = torch.randn(2, 3, 64, 64)
    for name, method in explain.METHODS.items():
        for params in ({}, method.params_for(classifier.takes_prompts)):
            maps = method.maps(classifier.model, pixels, [1, 2], **params)
            assert maps.shape == (2, 4, 4) and torch.isfinite(maps).all(), name
    curve = explain.deletion_curve(classifier.model, pixels, maps, target=[1, 2], steps=4)
    assert curve.scores.shape == (2, 5) and torch.isfinite(curve.auc).all()


def test_reinitialising_a_clip_model_changes_legrad_clip_and_chefer_clip(tmp_path):
    """Adebayo et al. 2018's model-randomisation check, for the CLIP forms of LeGrad and Chefer's relevance."""
    prompts = prompts_from_text("dog, cat, grass, sky")
    loaded = [vitviz.load(str(save_open_clip(open_clip_model(TINY_NAMES["quick_gelu"], seed=seed),
                                             TINY_NAMES["quick_gelu"], tmp_path / str(seed))), device="cpu")
              .with_prompts(prompts) for seed in (0, 123)]
    pixels = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    target = loaded[0].model(pixels).argmax(-1)
    for name in ("legrad", "chefer"):
        method = explain.METHODS[name]
        params = method.params_for(True)
        original, again = (method.maps(loaded[0].model, pixels, target, **params) for _ in range(2))
        randomised = method.maps(loaded[1].model, pixels, target, **params)
        for b in range(len(pixels)):
            assert spearman(original[b], again[b]) > 0.999
            assert spearman(original[b], randomised[b]) < 0.5, f"{name}, image {b}"


# ---- the authors' algorithms, written out on open_clip's modules --------------------------------------------

class Hooked:
    """legrad_torch 1.1's hooks (`hooked_resblock_forward`, `hooked_torch_multi_head_attention_forward`) on open_clip
    3.3's batch-first blocks from `start` on (negative: from the end): each block's output (`feat_post_mlp`) and
    post-softmax attention, (b heads) n n as torch's multi-head attention computes it (q scaled before q k^T).
    As `LeWrapper._activate_self_attention_hooks`, only those blocks' parameters keep requires_grad."""

    def __init__(self, model, start: int = 0):
        self.model, blocks = model, model.visual.transformer.resblocks
        self.start = start if start >= 0 else len(blocks) + start
        self.outputs, self.attentions = {}, {}
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith("visual.transformer.resblocks.")
                                     and int(name.split(".")[3]) >= self.start)
        for i in range(self.start, len(blocks)):
            blocks[i].attention = functools.partial(self._attention, i, blocks[i].attn)
            blocks[i].register_forward_hook(lambda module, args, output, i=i: self.outputs.__setitem__(i, output))

    def _attention(self, i, mha, q_x, k_x=None, v_x=None, attn_mask=None):
        b, n, c = q_x.shape
        heads = mha.num_heads
        q, k, v = F.linear(q_x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (rearrange(t, 'b n (h d) -> (b h) n d', h=heads) for t in (q, k, v))
        self.attentions[i] = probs = torch.bmm(q * (c // heads) ** -0.5, k.transpose(1, 2)).softmax(dim=-1)
        out = rearrange(torch.bmm(probs, v), '(b h) n d -> b n (h d)', h=heads)
        return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


def min_max(maps: torch.Tensor) -> torch.Tensor:
    """legrad_torch's `min_max`: per (batch, prompt) map, no epsilon."""
    low = maps.flatten(2).min(dim=-1).values[..., None, None]
    high = maps.flatten(2).max(dim=-1).values[..., None, None]
    return (maps - low) / (high - low)


def legrad_torch_compute_legrad_clip(hooked: Hooked, image: torch.Tensor, text_embedding: torch.Tensor) -> torch.Tensor:
    """`LeWrapper.compute_legrad_clip` (`layer_index`: the hooks' start): the image repeated per prompt; per
    block from the start on, the cosine of its token mean through ln_post and proj with its prompt, the ReLU of
    its gradient w.r.t. that block's attention averaged over heads and queries, class key dropped, upsampled
    bilinearly by the patch size, summed, min-max normalised: 1 prompts H W."""
    model, prompts = hooked.model, len(text_embedding)
    model.encode_image(image.repeat(prompts, 1, 1, 1))
    blocks = len(model.visual.transformer.resblocks)
    patch = model.visual.patch_size[0]
    side = int(math.sqrt(hooked.outputs[blocks - 1].shape[1] - 1))
    accumulated = 0
    for layer in range(hooked.start, blocks):
        features = F.normalize(model.visual.ln_post(hooked.outputs[layer].mean(dim=1)) @ model.visual.proj, dim=-1)
        score = (torch.eye(prompts, device=image.device) * (text_embedding @ features.T)).sum()
        grad = torch.autograd.grad(score, [hooked.attentions[layer]], retain_graph=True, create_graph=True)[0]
        grad = rearrange(grad, '(b h) n m -> b h n m', b=prompts).clamp(min=0)
        relevance = grad.mean(dim=1).mean(dim=1)[:, 1:]
        expl = rearrange(relevance, 'b (w h) -> 1 b w h', w=side, h=side)
        accumulated = accumulated + F.interpolate(expl, scale_factor=patch, mode="bilinear")
    return min_max(accumulated)


def chefer_clip_interpret(hooked: Hooked, image: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
    """Transformer-MM-Explainability's `CLIP_explainability.ipynb` `interpret` (image side; `start_layer`: the
    hooks' start): logits_per_image of each image copy and its prompt; R = I, R += mean_h(clamp(grad * A, 0)) R
    over the blocks from the start; the class row without the class column: prompts (n - 1)."""
    model, prompts = hooked.model, len(texts)
    image_features, text_features, scale = model(image.repeat(prompts, 1, 1, 1), texts)[:3]
    logits_per_image = scale * image_features @ text_features.T
    one_hot = (torch.eye(prompts) * logits_per_image).sum()
    tokens = hooked.attentions[hooked.start].shape[-1]
    relevance = torch.eye(tokens).expand(prompts, tokens, tokens)
    for i in range(hooked.start, len(model.visual.transformer.resblocks)):
        grad = torch.autograd.grad(one_hot, [hooked.attentions[i]], retain_graph=True)[0].detach()
        cam = (grad * hooked.attentions[i].detach()).reshape(prompts, -1, tokens, tokens).clamp(min=0).mean(dim=1)
        relevance = relevance + torch.bmm(cam, relevance)
    return relevance[:, 0, 1:]


def test_legrad_clip_is_legrad_torchs_compute_legrad_clip(quickgelu):
    folder, reference = quickgelu
    prompts = prompts_from_text("dog, cat, grass")
    classifier = vitviz.load(str(folder), device="cpu").with_prompts(prompts)
    image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        text_embedding = F.normalize(reference.encode_text(open_clip.get_tokenizer("ViT-B-16")(prompts)), dim=-1)
    expected = legrad_torch_compute_legrad_clip(Hooked(copy.deepcopy(reference), -2), image, text_embedding)[0]
    ours = explain.legrad(classifier.model, image.repeat(3, 1, 1, 1), [0, 1, 2],
                          **explain.METHODS["legrad"].params_for(True))
    upsampled = min_max(F.interpolate(ours[None], scale_factor=16, mode="bilinear"))[0]
    np.testing.assert_allclose(upsampled.numpy(), expected.detach().numpy(), rtol=0, atol=1e-4)
    assert (expected.flatten(1).std(dim=1) > 0.1).all()


def test_chefer_clip_is_the_clip_notebooks_interpret(quickgelu):
    folder, reference = quickgelu
    prompts = prompts_from_text("dog, cat, grass")
    classifier = vitviz.load(str(folder), device="cpu").with_prompts(prompts)
    image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    expected = chefer_clip_interpret(Hooked(copy.deepcopy(reference), -1), image,
                                     open_clip.get_tokenizer("ViT-B-16")(prompts))
    ours = explain.chefer_relevance(classifier.model, image.repeat(3, 1, 1, 1), [0, 1, 2],
                                    **explain.METHODS["chefer"].params_for(True))
    np.testing.assert_allclose(ours.flatten(1).numpy(), expected.numpy(), rtol=1e-4, atol=1e-6)
    assert (expected.std(dim=1) > 0).all()


# ---- evaluate with prompts --------------------------------------------------------------------------------

def test_evaluate_with_prompts_scores_a_clip_model_against_the_data_sets_labels(tmp_path, quickgelu):
    data = tmp_path / "data"
    for k, name in enumerate(["cat", "dog"]):
        (data / name).mkdir(parents=True)
        for i in range(2):
            rgb = np.random.default_rng(10 * k + i).integers(0, 255, (72, 80, 3), dtype=np.uint8)
            Image.fromarray(rgb).save(data / name / f"{i}.png")
    out = tmp_path / "eval"
    assert cli(["evaluate", "--models", str(quickgelu[0]), "--prompts", PROMPT_TEMPLATE, "--data", str(data),
                "--out", str(out), "--methods", "legrad", "chefer", "--steps", "2", "--regions", "4",
                "--batch-size", "4", "--device", "cpu"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    model = summary["models"][quickgelu[0].name]
    assert model["score_against"] == "label" and model["accuracy"] is not None
    assert set(model["methods"]) == {"legrad", "chefer", "random"}
    assert cli(["evaluate", "--models", str(quickgelu[0]), "--data", str(data), "--out", str(out)]) == 2


# ---- the page: type what to look for -------------------------------------------------------------------------

def test_the_page_classifies_over_the_typed_prompts_and_every_class_method_explains_each(quickgelu, monkeypatch):
    """A person picks a CLIP model and types "dog, ball, grass": the predictions are the zero-shot probabilities
    over "a photo of a dog", ...; the class dropdown offers every prompt and each method explains the one
    chosen (through the app's GPU functions, the model loaded by name); with nothing typed the page says what to do."""
    from vitviz.ui import classes, gpu, page, shared
    folder, _ = quickgelu
    monkeypatch.setattr(gpu.boundary, "LOCAL_ALLOWED", {str(folder)})   # as the owner's --vit FOLDER allows it
    quiet = dict(progress=lambda *args, **kwargs: None)
    answer = page.explain({"path": str(PHOTO)}, str(folder), "vit-cifar10", "dog, ball, grass", **quiet)
    prompts = ["a photo of a dog", "a photo of a ball", "a photo of a grass"]
    clip = vitviz.load(str(folder), device="cpu").with_prompts(prompts)
    run = shared.runs(answer.key)[0]
    with torch.no_grad():
        expected = clip.model(run.pixels).softmax(dim=-1)[0]
    assert answer.label_a == pytest.approx({p: float(v) for p, v in zip(prompts, expected)}, abs=1e-6)
    offered = classes.class_choices(answer.key).target_a.choices
    assert sorted(index for _, index in offered) == [0, 1, 2] and all("a photo of a" in text for text, _ in offered)
    for method in (m for m in explain.METHODS.values() if m.targeted):
        views = classes.render_gradients(answer.key, method.name, 1, None, None)
        assert views[0].ndim == 3 and "a photo of a ball" in run.explained_target(method.name, target=1)
    legrad = run.token_map("legrad", target=1, **explain.METHODS["legrad"].params_for(True))
    local = explain.METHODS["legrad"].maps(clip.model, run.pixels, [1], **explain.METHODS["legrad"].params_for(True))
    assert np.allclose(legrad, local[0].numpy(), atol=1e-6)   # the tab's map is the library's, at the authors' layers
    plain = page.explain({"path": str(PHOTO)}, str(folder), "vit-cifar10", "", **quiet)
    assert plain.label_a == f"{folder.name}: type what to look for (comma separated) to get predictions"
    assert page.prompt_box("clip-b16", "vit-cifar10").visible and not page.prompt_box("vit-base", "cvt-13").visible
