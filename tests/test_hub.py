"""`vitviz.load` against the fake Hub (tests/hub_server.py): Hub checkpoints in timm's and
transformers' real layouts load into our models with the references' logits, preprocessing and
labels; downloads happen once; offline and unreachable Hubs fall back to the cache or say so within
3 s; every failure is a plain LoadError after which a good load still works.

Every test gets its own Hugging Face cache folder, so what one test downloads no other test sees.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import re
import threading
import time
import weakref

import open_clip
import pytest
import torch
from huggingface_hub import constants as hf_constants
from PIL import Image
from timm.data import ImageNetInfo, create_transform, resolve_data_config
from timm.models import get_pretrained_cfg
from transformers.models.convnext.image_processing_pil_convnext import ConvNextImageProcessorPil

import vitviz
from hub_server import (
    closed_port_url,
    cvt_checkpoint,
    cvt_processor_config,
    files_of,
    pickle_with_code,
    timm_checkpoint,
    use_endpoint,
)
from vitviz import catalog, hub as vhub
from vitviz.bundle import save_bundle
from vitviz.hub import LoadError, Source
from vitviz.models import ViT, ViTConfig
from vitviz.preprocess import IMAGENET_MEAN, IMAGENET_STD, Transform

TOL = 1e-5
TINY = dict(depth=1, embed_dim=32, num_heads=2)
TIMM_CASES = {   # timm tag -> what it exercises in the architecture mapping
    "vit_base_patch16_224.augreg2_in21k_ft_in1k": "class token, mean/std 0.5",
    "deit_tiny_distilled_patch16_224.fb_in1k": "distillation token and head",
    "vit_medium_patch16_reg4_gap_256.sbb_in1k": "4 registers, no class token, avg pool, fc_norm, LayerScale, 256 px",
    "deit3_small_patch16_224.fb_in1k": "LayerScale, position embedding without the class token",
}
BUNDLED_HINT = "Bundled models work offline: vit-cifar10, cvt-cifar10, swin-cifar10, resnet-cifar10."

pytestmark = pytest.mark.usefixtures("own_caches")


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    return Image.open("/work/shared/examples/cat_chelsea.jpg").convert("RGB")


@pytest.fixture(scope="module", params=list(TIMM_CASES), ids=list(TIMM_CASES.values()))
def timm_repo(request, hub, tmp_path_factory):
    folder = tmp_path_factory.mktemp("timm")
    reference = timm_checkpoint(folder, request.param, **TINY)
    repo_id = f"test/{request.param}"
    return repo_id, reference, hub.publish(repo_id, files_of(folder))


@pytest.fixture(scope="module")
def vit_files(tmp_path_factory) -> tuple[dict[str, bytes], torch.nn.Module]:
    """A small timm ViT checkpoint (safetensors) to publish under new names, and its timm model."""
    folder = tmp_path_factory.mktemp("vit")
    reference = timm_checkpoint(folder, "vit_base_patch16_224.augreg2_in21k_ft_in1k", **TINY)
    return files_of(folder), reference


def repo_named(text: str) -> str:
    """A valid repo id in the test namespace made from any text (a test's name)."""
    return "test/" + re.sub(r"-+", "-", re.sub(r"[^A-Za-z0-9_.]", "-", text))[:80].strip("-.") + "-r"


@pytest.fixture
def good_repo(hub, vit_files, request) -> str:
    """A freshly published, loadable repo, named after the test."""
    repo_id = repo_named(request.node.name)
    hub.publish(repo_id, vit_files[0])
    return repo_id


def logits_error(loaded: vitviz.LoadedModel, reference: torch.nn.Module, pixels: torch.Tensor) -> float:
    """Largest logit difference between our loaded model and the reference (timm's or transformers')."""
    with torch.no_grad():
        theirs = reference(pixels)
        theirs = theirs.logits if hasattr(theirs, "logits") else theirs
        return (loaded.model(pixels) - theirs).abs().max().item()


# ---- what loads, and that it is right --------------------------------------------------------------------

def test_timm_checkpoints_load_with_timms_logits_preprocessing_and_imagenet_labels(timm_repo, photo):
    repo_id, reference, commit = timm_repo
    loaded = vitviz.load(repo_id, device="cpu")
    pixels = loaded.preprocess(photo)
    timm_pixels = create_transform(**resolve_data_config({}, model=reference))(photo)[None]
    assert (pixels - timm_pixels).abs().max() <= TOL
    assert logits_error(loaded, reference.eval(), pixels) <= TOL
    assert loaded.family == "vit" and not loaded.model.training
    assert loaded.labels == tuple(ImageNetInfo("imagenet-1k").label_descriptions())
    assert loaded.source == Source("hub", repo_id, "timm", "model.safetensors", "main", commit)


@pytest.mark.parametrize("size, weights", [(224, "safetensors"), (384, "bin")],
                         ids=["224 px, model.safetensors (like cvt-13)", "384 px, only a .bin (like cvt-13-384)"])
def test_transformers_cvt_loads_with_its_logits_processor_pixels_and_id2label(hub, tmp_path, photo, size, weights):
    labels = ["tabby cat", "mountain dog", "container ship", "swan", "coffee"]
    reference = cvt_checkpoint(tmp_path / "cvt", size=size, weights=weights, labels=labels)
    repo_id = f"test/cvt-{size}-{weights}"
    commit = hub.publish(repo_id, files_of(tmp_path / "cvt"))
    loaded = vitviz.load(repo_id, device="cpu")
    pixels = loaded.preprocess(photo)
    processor_pixels = ConvNextImageProcessorPil.from_dict(cvt_processor_config(size))(photo, return_tensors="pt")
    assert pixels.shape[-1] == size and (pixels - processor_pixels["pixel_values"]).abs().max() <= TOL
    assert logits_error(loaded, reference.eval(), pixels) <= TOL
    assert loaded.family == "cvt" and loaded.labels == tuple(labels)
    weights_file = {"safetensors": "model.safetensors", "bin": "pytorch_model.bin"}[weights]
    assert loaded.source == Source("hub", repo_id, "transformers", weights_file, "main", commit)


def test_a_cvt_repo_without_preprocessor_config_gets_cvts_own_224_px_evaluation(hub, tmp_path):
    cvt_checkpoint(tmp_path / "cvt", processor=False)
    hub.publish("test/cvt-no-processor", files_of(tmp_path / "cvt"))
    transform = vitviz.load("test/cvt-no-processor", device="cpu").transform
    assert transform == Transform(crop=(224, 224), resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                                  interpolation="bicubic", crop_rounding="floor")


def test_a_bundle_folder_loads_with_its_own_labels_and_preprocessing_and_fp16_weights(tmp_path, photo):
    torch.manual_seed(0)
    model = ViT(ViTConfig(img_size=(32, 32), patch_size=8, num_classes=3, embed_dim=32, depth=2, num_heads=2)).eval()
    transform = Transform(crop=(32, 32), resize=32, mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2))
    save_bundle(tmp_path / "bundle", model, transform=transform, labels=["cat", "dog", "ship"])
    loaded = vitviz.load(str(tmp_path / "bundle"), device="cpu")
    assert loaded.labels == ("cat", "dog", "ship") and loaded.transform == transform
    assert loaded.source == Source("folder", str((tmp_path / "bundle").resolve()), "vitviz", "model.safetensors")
    with torch.no_grad():   # the bundle stores fp16: the reference is the model with its weights rounded so
        for p in model.parameters():
            p.copy_(p.half().float())
    assert logits_error(loaded, model, loaded.preprocess(photo)) <= TOL


def test_a_revision_with_a_slash_reaches_the_hub_quoted_and_loads(hub, vit_files):
    hub.publish("test/with-pr", {"config.json": b"{}"})
    commit = hub.publish("test/with-pr", vit_files[0], branch="refs/pr/1")
    loaded = vitviz.load("test/with-pr@refs/pr/1", device="cpu")
    assert (loaded.source.revision, loaded.source.commit) == ("refs/pr/1", commit)


def test_progress_hears_each_download_up_to_its_end(good_repo):
    heard = []
    vitviz.load(good_repo, device="cpu", progress=lambda fraction, what: heard.append((fraction, what)))
    weights = [f for f, what in heard if "model.safetensors" in what and good_repo in what]
    assert weights and weights[-1] == 1.0 and weights == sorted(weights)


# ---- downloaded once, cached, offline ---------------------------------------------------------------------

def test_a_second_load_makes_no_request_and_a_reload_downloads_nothing(hub, good_repo, photo):
    first = vitviz.load(good_repo, device="cpu")
    requests, gets = hub.count(repo_id=good_repo), hub.count(repo_id=good_repo, method="GET")
    assert vitviz.load(good_repo, device="cpu") is first
    assert hub.count(repo_id=good_repo) == requests
    vhub.clear_cache()   # a new process, as far as vitviz knows: only the HF cache is left
    again = vitviz.load(good_repo, device="cpu")
    assert hub.count(repo_id=good_repo, method="GET") == gets   # where 'main' points is asked, nothing fetched
    assert hub.count(repo_id=good_repo, method="HEAD") == requests - gets + 2
    pixels = first.preprocess(photo)
    assert torch.equal(again.model(pixels), first.model(pixels))
    vhub.clear_cache()
    requests = hub.count(repo_id=good_repo)
    by_commit = vitviz.load(f"{good_repo}@{first.source.commit}", device="cpu")   # a commit never changes
    assert hub.count(repo_id=good_repo) == requests and by_commit.source.commit == first.source.commit


def test_concurrent_loads_of_one_model_download_it_once_and_share_it(hub, good_repo):
    loaded = [None] * 4
    threads = [threading.Thread(target=lambda i=i: loaded.__setitem__(i, vitviz.load(good_repo, device="cpu")))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(m is loaded[0] for m in loaded)
    assert hub.count(repo_id=good_repo, method="GET", filename="model.safetensors") == 1


def test_offline_mode_serves_cached_models_without_a_request_and_names_the_rest(hub, good_repo, monkeypatch, photo):
    online = vitviz.load(good_repo, device="cpu")
    vhub.clear_cache()
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    requests = hub.count()
    offline = vitviz.load(good_repo, device="cpu")
    assert hub.count() == requests
    assert offline.source.commit == online.source.commit
    pixels = online.preprocess(photo)
    assert torch.equal(offline.model(pixels), online.model(pixels))
    with pytest.raises(LoadError) as error:
        vitviz.load("test/never-downloaded", device="cpu")
    assert "'test/never-downloaded'" in str(error.value) and "offline mode" in str(error.value)
    assert BUNDLED_HINT in str(error.value) and hub.count() == requests


def test_cached_catalog_models_are_listed_with_their_size_and_named_when_offline(hub, tmp_path, monkeypatch):
    cvt_checkpoint(tmp_path / "cvt")
    files = files_of(tmp_path / "cvt")
    hub.publish("microsoft/cvt-13", files)   # the catalog's name, served by the fake Hub
    try:
        assert "cvt-13" not in vhub.cached_models()
        vitviz.load("cvt-13", device="cpu")
        sizes = vhub.cached_models()
        assert sizes["cvt-13"] == sum(len(b) for b in files.values()) and "cvt-21" not in sizes
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        with pytest.raises(LoadError, match=f"Cached models: cvt-13. {BUNDLED_HINT}"):
            vitviz.load("cvt-21", device="cpu")
    finally:
        hub.remove("microsoft/cvt-13")


def test_available_says_whether_a_model_can_be_had_now_without_raising(hub, good_repo, monkeypatch):
    assert vhub.available(good_repo)                        # the Hub answers for it
    assert not vhub.available("test/not-published")         # the Hub says it doesn't exist
    assert not vhub.available("../etc/passwd") and not vhub.available("vit-bse")
    vitviz.load(good_repo, device="cpu")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    assert vhub.available(good_repo)                        # cached
    assert not vhub.available(repo_named("available but never downloaded"))


UNREACHABLE = {
    "connection refused": lambda hub, monkeypatch, repos: use_endpoint(monkeypatch, closed_port_url()),
    "DNS failure": lambda hub, monkeypatch, repos: use_endpoint(monkeypatch, "http://vitviz-no-such-host.invalid"),
    "no answer (timeout)": lambda hub, monkeypatch, repos: [
        hub.fail(r, "config.json", "stall", method="HEAD", seconds=10) for r in repos],
    "HTTP 503": lambda hub, monkeypatch, repos: [
        hub.fail(r, "config.json", "status", status=503, method=None) for r in repos],
}


@pytest.mark.parametrize("outage", UNREACHABLE.values(), ids=UNREACHABLE.keys())
def test_an_unreachable_hub_serves_the_cache_and_names_the_missing_model_and_bundled_ones_within_3_s(
        hub, vit_files, monkeypatch, request, outage):
    case = request.node.callspec.id
    cached, missing = repo_named(f"cached {case}"), repo_named(f"missing {case}")
    for repo_id in (cached, missing):
        hub.publish(repo_id, vit_files[0])
    vitviz.load(cached, device="cpu")
    vhub.clear_cache()
    outage(hub, monkeypatch, [cached, missing])
    try:
        assert vitviz.load(cached, device="cpu").source.location == cached
        start = time.monotonic()
        with pytest.raises(LoadError) as error:
            vitviz.load(missing, device="cpu")
        assert time.monotonic() - start < 3.0
        assert f"Could not download '{missing}'" in str(error.value) and BUNDLED_HINT in str(error.value)
    finally:
        hub.heal()


# ---- bad requests and bad repos: a clear error each, and the next good load works ----------------------------

@pytest.mark.parametrize("source", [
    "../etc/passwd", "/etc/passwd", "~/.ssh/id_rsa", "./checkpoints/vit-cifar10", "C:\\models\\vit",
    "https://huggingface.co/timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "hf.co/timm/vit",
    "timm/../../etc", "timm\\vit", "timm/vit@../../main", "timm/vit@", "timm/vit@a b", "a/b/c", "-x/y", "x/y.",
    "x--y/z", "", "   ", "vit-bse",
])
def test_malformed_and_path_trick_ids_are_refused_before_any_request(hub, source):
    requests = hub.count()
    with pytest.raises(LoadError, match="Use a catalog name"):
        vitviz.load(source, device="cpu", allow_local=False)
    assert hub.count() == requests


def test_a_typo_of_a_catalog_name_is_answered_with_the_name(hub):
    with pytest.raises(LoadError, match="did you mean 'vit-base'"):
        vitviz.load("vit-bse", device="cpu")


def test_local_folders_load_only_where_allowed(tmp_path):
    model = ViT(ViTConfig(img_size=(32, 32), patch_size=8, num_classes=2, embed_dim=32, depth=1, num_heads=2))
    save_bundle(tmp_path / "mine", model, transform=Transform(crop=(32, 32), resize=32, mean=IMAGENET_MEAN,
                                                              std=IMAGENET_STD), labels=["a", "b"])
    assert vitviz.load(str(tmp_path / "mine"), device="cpu").labels == ("a", "b")
    with pytest.raises(LoadError, match="local folders are not accepted here"):
        vitviz.load(str(tmp_path / "mine"), device="cpu", allow_local=False)
    with pytest.raises(LoadError, match="has no config.json"):
        vitviz.load(str(tmp_path), device="cpu")


def test_a_repo_that_does_not_exist_is_a_clear_error(hub, good_repo):
    with pytest.raises(LoadError, match="'test/no-such-repo' is not on the Hugging Face Hub"):
        vitviz.load("test/no-such-repo", device="cpu")
    with pytest.raises(LoadError, match="has no revision 'no-such-branch'"):
        vitviz.load(f"{good_repo}@no-such-branch", device="cpu")
    assert vitviz.load(good_repo, device="cpu").family == "vit"


def test_a_repo_without_weights_is_a_clear_error_and_loads_once_they_are_published(hub, vit_files):
    hub.publish("test/weights-later", {"config.json": vit_files[0]["config.json"]})
    with pytest.raises(LoadError, match="has neither model.safetensors nor pytorch_model.bin"):
        vitviz.load("test/weights-later", device="cpu")
    hub.publish("test/weights-later", vit_files[0])
    assert vitviz.load("test/weights-later", device="cpu").source.weights == "model.safetensors"


def test_a_repo_without_config_json_is_not_taken_for_a_model(hub, vit_files):
    hub.publish("test/no-config", {"model.safetensors": vit_files[0]["model.safetensors"]})
    with pytest.raises(LoadError, match="has no config.json, so it is not a timm or transformers image model"):
        vitviz.load("test/no-config", device="cpu")


def test_http_500_while_downloading_weights_is_a_clear_error_and_a_retry_works(hub, good_repo):
    hub.fail(good_repo, "model.safetensors", "status", status=500, times=1)
    with pytest.raises(LoadError, match=r"Downloading model.safetensors of .* failed \(the Hub answered HTTP 500\)"):
        vitviz.load(good_repo, device="cpu")
    assert vitviz.load(good_repo, device="cpu").source.weights == "model.safetensors"


def test_a_connection_dropped_mid_file_is_resumed_with_a_range_request_and_the_model_is_right(
        hub, tmp_path, photo):
    # huggingface_hub keeps what it received in whole 10 MiB chunks and asks for the rest with Range
    reference = timm_checkpoint(tmp_path, "vit_base_patch16_224.augreg2_in21k_ft_in1k", depth=6, embed_dim=192,
                                num_heads=3)
    files = files_of(tmp_path)
    chunk = 10 * 2**20
    assert len(files["model.safetensors"]) > chunk + 2**20
    hub.publish("test/dropped-mid-file", files)
    hub.fail("test/dropped-mid-file", "model.safetensors", "drop", at=chunk + 2**19, times=1)
    loaded = vitviz.load("test/dropped-mid-file", device="cpu")
    assert [r.range for r in hub.requests if r.repo_id == "test/dropped-mid-file" and r.method == "GET"
            and r.filename == "model.safetensors"] == [None, f"bytes={chunk}-"]
    assert logits_error(loaded, reference.eval(), loaded.preprocess(photo)) <= TOL


def test_a_connection_that_keeps_dropping_is_a_clear_error_and_a_later_download_works(hub, good_repo):
    hub.fail(good_repo, "model.safetensors", "drop")   # huggingface_hub retries 5 times, 1 s apart
    try:
        with pytest.raises(LoadError, match="Downloading model.safetensors of .* failed"):
            vitviz.load(good_repo, device="cpu")
    finally:
        hub.heal()
    assert vitviz.load(good_repo, device="cpu").source.weights == "model.safetensors"


def test_a_file_corrupted_in_transit_fails_its_sha256_is_removed_and_downloads_again(hub, good_repo):
    hub.fail(good_repo, "model.safetensors", "corrupt", times=1)
    with pytest.raises(LoadError, match="model.safetensors of .* is damaged .*SHA-256.*removed from the cache"):
        vitviz.load(good_repo, device="cpu")
    vitviz.load(good_repo, device="cpu")
    assert hub.count(repo_id=good_repo, method="GET", filename="model.safetensors") == 2


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) * 3 // 5], lambda b: b"\xff" * 8 + b[8:]],
                         ids=["truncated", "header overwritten"])
def test_a_damaged_safetensors_on_the_hub_is_a_clear_error_and_a_fixed_commit_loads(hub, vit_files, damage):
    files = vit_files[0]
    hub.publish("test/damaged", {**files, "model.safetensors": damage(files["model.safetensors"])})
    with pytest.raises(LoadError, match="model.safetensors of 'test/damaged' is damaged"):
        vitviz.load("test/damaged", device="cpu")
    hub.publish("test/damaged", files)
    assert vitviz.load("test/damaged", device="cpu").source.weights == "model.safetensors"


def timm_config(architecture: str) -> bytes:
    return json.dumps({"architecture": architecture, "num_classes": 1000,
                       "pretrained_cfg": {"input_size": [3, 224, 224], "crop_pct": 0.9, "num_classes": 1000}}).encode()


@pytest.mark.parametrize("config, named", [
    (timm_config("swinv2_tiny_window8_256"), "SwinV2"),
    (json.dumps({"model_type": "swinv2", "architectures": ["Swinv2ForImageClassification"]}).encode(), "SwinV2"),
    (timm_config("maxvit_tiny_tf_224"), "MaxViT"),
    (json.dumps({"model_type": "dinat", "architectures": ["DinatForImageClassification"]}).encode(), "DiNAT"),
    (timm_config("vit_base_patch16_clip_quickgelu_224"), "timm"),
], ids=["timm SwinV2", "transformers SwinV2", "timm MaxViT", "transformers DiNAT",
        "timm CLIP ViT (QuickGELU, LayerNorm eps 1e-5)"])
def test_an_unsupported_architecture_is_refused_before_its_weights_are_downloaded(hub, vit_files, good_repo, config,
                                                                                   named):
    repo_id = f"test/unsupported-{hashlib.sha1(config).hexdigest()[:8]}"
    hub.publish(repo_id, {"config.json": config, "model.safetensors": vit_files[0]["model.safetensors"]})
    with pytest.raises(LoadError, match=f"{named}.*; vitviz runs ViT, DeiT, Swin, ResNet and ConvNeXt checkpoints "
                                        f"from timm, CvT, Swin"):
        vitviz.load(repo_id, device="cpu")
    assert hub.count(repo_id=repo_id, method="GET", filename="model.safetensors") == 0
    assert vitviz.load(good_repo, device="cpu").family == "vit"


def test_a_timm_architecture_timm_does_not_know_is_a_clear_error(hub):
    hub.publish("test/unknown-arch", {"config.json": timm_config("vit_imaginary_patch16_224")})
    with pytest.raises(LoadError, match="names a timm architecture 'vit_imaginary_patch16_224' that timm"):
        vitviz.load("test/unknown-arch", device="cpu")


def test_tensors_that_do_not_fit_the_config_are_a_clear_error(hub, tmp_path, vit_files, good_repo):
    wider = timm_checkpoint(tmp_path, "vit_base_patch16_224.augreg2_in21k_ft_in1k", depth=1, embed_dim=48,
                            num_heads=2)
    assert wider.embed_dim == 48
    hub.publish("test/misfit", {"config.json": vit_files[0]["config.json"],
                                "model.safetensors": (tmp_path / "model.safetensors").read_bytes()})
    with pytest.raises(LoadError, match="the tensors in model.safetensors do not fit its config.json"):
        vitviz.load("test/misfit", device="cpu")
    assert vitviz.load(good_repo, device="cpu").family == "vit"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")   # torch notes the bare pickle's protocol
@pytest.mark.parametrize("zipped", [True, False], ids=["torch.save zip", "bare pickle"])
def test_a_pytorch_model_bin_with_pickled_code_is_refused_and_never_run(hub, tmp_path, vit_files, good_repo, zipped):
    marker = tmp_path / "code-ran"
    bin_path = tmp_path / "pytorch_model.bin"
    pickle_with_code(bin_path, marker, vit_files[1].state_dict(), zipped=zipped)
    repo_id = f"test/pickled-code-{zipped}"
    hub.publish(repo_id, {"config.json": vit_files[0]["config.json"], "pytorch_model.bin": bin_path.read_bytes()})
    with pytest.raises(LoadError, match="pytorch_model.bin was refused: it is not tensors alone"):
        vitviz.load(repo_id, device="cpu")
    assert not marker.exists()
    assert vitviz.load(good_repo, device="cpu").family == "vit"
    with contextlib.suppress(Exception):   # the payload is real: an unsafe loader would have run it
        torch.load(bin_path, weights_only=False)
    assert marker.exists()


# ---- the in-process cache stays bounded -----------------------------------------------------------------------

def test_loaded_models_are_kept_least_recently_used_first_within_count_and_bytes(tmp_path, monkeypatch):
    folders = []
    for name in "abc":
        model = ViT(ViTConfig(img_size=(32, 32), patch_size=8, num_classes=2, embed_dim=32, depth=1, num_heads=2))
        save_bundle(tmp_path / name, model, transform=Transform(crop=(32, 32), resize=32, mean=IMAGENET_MEAN,
                                                                std=IMAGENET_STD), labels=["x", "y"])
        folders.append(str(tmp_path / name))
    a, b, c = folders
    monkeypatch.setattr(vhub.CACHE, "max_models", 2)
    first_a = vitviz.load(a, device="cpu")
    vitviz.load(b, device="cpu")
    assert vitviz.load(a, device="cpu") is first_a   # a is now the most recently used
    vitviz.load(c, device="cpu")
    assert vhub.CACHE.names() == ["a", "c"]
    monkeypatch.setattr(vhub.CACHE, "max_bytes", first_a.nbytes * 3 // 2)
    vhub.clear_cache()
    vitviz.load(a, device="cpu")
    vitviz.load(b, device="cpu")
    assert vhub.CACHE.names() == ["b"] and vhub.CACHE.nbytes <= vhub.CACHE.max_bytes
    monkeypatch.setattr(vhub.CACHE, "max_bytes", first_a.nbytes // 2)
    assert vitviz.load(c, device="cpu").labels == ("x", "y")   # too big to keep: returned, not cached,
    assert vhub.CACHE.names() == []                            # and b no longer fits either


def test_a_model_dropped_from_the_cache_but_still_in_use_is_handed_out_again_not_loaded_twice(tmp_path, monkeypatch):
    """The app's kept sessions hold their models: a second copy beside the first would only grow memory."""
    for name in "ab":
        model = ViT(ViTConfig(img_size=(32, 32), patch_size=8, num_classes=2, embed_dim=32, depth=1, num_heads=2))
        save_bundle(tmp_path / name, model, transform=Transform(crop=(32, 32), resize=32, mean=IMAGENET_MEAN,
                                                                std=IMAGENET_STD), labels=["x", "y"])
    monkeypatch.setattr(vhub.CACHE, "max_models", 1)
    in_use = vitviz.load(str(tmp_path / "a"), device="cpu")
    vitviz.load(str(tmp_path / "b"), device="cpu")
    assert vhub.CACHE.names() == ["b"]                                    # a was dropped ...
    assert vitviz.load(str(tmp_path / "a"), device="cpu") is in_use      # ... but is still the one in use
    assert vhub.CACHE.names() == ["a"]
    held = weakref.ref(in_use)
    del in_use
    vitviz.load(str(tmp_path / "b"), device="cpu")
    gc.collect()
    assert held() is None                                                 # nobody holds a now: it is gone
    assert vitviz.load(str(tmp_path / "a"), device="cpu").labels == ("x", "y")   # and is read again


# ---- the catalog ---------------------------------------------------------------------------------------------

def test_catalog_hub_entries_parse_and_timm_ones_are_the_repos_timms_registry_names():
    for entry in catalog.CATALOG.values():
        if entry.bundled:
            assert entry.path == catalog.CHECKPOINTS / entry.source
            continue
        assert vhub.parse_source(entry.name).repo_id == entry.source
        if entry.takes_prompts:   # CLIP: a repo open_clip's pretrained registry downloads from
            assert f"{entry.source}/" in {open_clip.get_pretrained_cfg(*pair).get("hf_hub")
                                          for pair in open_clip.list_pretrained()}
        elif entry.source.startswith("timm/"):   # ViT, Swin, ResNet, ConvNeXt
            assert get_pretrained_cfg(entry.source.removeprefix("timm/")).hf_hub_id == entry.source
        else:
            assert entry.family == "cvt" and entry.source.startswith("microsoft/cvt-")
    assert [e.name for e in catalog.bundled()][:2] == list(catalog.BUNDLED_PAIR)
    assert [catalog.CATALOG[name].family for name in catalog.IMAGENET_PAIR + catalog.BUNDLED_PAIR] == ["vit", "cvt"] * 2
    assert {"vit-tiny", "vit-small", "vit-base", "deit-tiny", "deit-small", "deit-tiny-distilled", "cvt-13",
            "cvt-21", "cvt-13-384", "cvt-w24-384"} <= set(catalog.CATALOG)
