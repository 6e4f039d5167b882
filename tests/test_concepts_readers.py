"""Published dictionaries load: SAELens's folders, saev's sae.pt and ViT-Prisma's config.json + .pt, from a folder,
a Hub repo id or a catalog name, with the codes and reconstructions of the tools that wrote them.

References are independent of vitviz's readers: the SAELens folders and their outputs were written by sae-lens 6
itself (tests/fixtures/saelens/make.py, run in a side environment, as sae-lens needs TransformerLens < 4); saev's
and ViT-Prisma's files are written here in their documented formats and compared with their encoders' formulas,
written out below from their source (saev's `nn/modeling.py` through its schemas, ViT-Prisma's `sae/sae.py`).
Hub loads go through the fake Hub of tests/hub_server.py, each test with a cache of its own.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import constants as hf_constants
from safetensors.torch import load_file, save_file

from hub_server import CodeInPickle, files_of
from vitviz import catalog, concepts
from vitviz.concepts import ConceptsError, Origin, Standard, TopK
from vitviz.concepts.kinds.jumprelu import JumpReLU

SAELENS = Path(__file__).parent / "fixtures" / "saelens"
SAELENS_CASES = {   # case -> the vitviz kind it reads as, and the block of its hook
    "standard": (Standard, 3), "standard-b_dec-not-applied": (Standard, 3),   # blocks.4.hook_resid_pre
    "topk": (TopK, 3), "topk-rescaled": (TopK, 3), "jumprelu": (JumpReLU, 3), "batchtopk": (JumpReLU, 3),
    "batchtopk-checkpoint": (JumpReLU, 3), "standard-layer-norm": (Standard, 3),
    "topk-constant-norm-rescale": (TopK, 3),
}
PER_TOKEN_CASES = {"standard-layer-norm": "layer_norm", "topk-constant-norm-rescale": "constant_norm_rescale"}
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.pt filter=lfs diff=lfs merge=lfs -text\n"
D, N, K = 10, 40, 5
TOL = 1e-6

pytestmark = pytest.mark.usefixtures("own_caches")


def weights(*, seed: int = 0, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Random W_enc, b_enc, W_dec, b_dec of a d = 10, 40-concept dictionary, the decoder rows of unit norm."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(N, D, generator=g, dtype=dtype)
    return {"W_enc": torch.randn(D, N, generator=g, dtype=dtype) / D ** 0.5,
            "b_enc": 0.3 * torch.randn(N, generator=g, dtype=dtype) + 0.2,
            "W_dec": rows / rows.norm(dim=1, keepdim=True), "b_dec": 0.5 * torch.randn(D, generator=g, dtype=dtype)}


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randn(64, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 1.5 + 0.3


def assert_codes_and_reconstructions(dictionary, x, codes, reconstruction):
    torch.testing.assert_close(dictionary.encode(x), codes, atol=TOL, rtol=0)
    torch.testing.assert_close(dictionary.decode(dictionary.encode(x), x), reconstruction, atol=TOL, rtol=0)
    torch.testing.assert_close(dictionary(x), reconstruction, atol=TOL, rtol=0)
    assert (codes > 0).any() and (codes == 0).any()   # a reference that is neither all on nor all off


# ---- SAELens: folders written by sae-lens itself -------------------------------------------------------------

@pytest.mark.parametrize("case", list(SAELENS_CASES))
def test_saelens_folders_written_by_sae_lens_encode_and_decode_as_sae_lens_does(case):
    kind, block = SAELENS_CASES[case]
    reference = np.load(SAELENS / f"{case}.npz")
    dictionary = concepts.load(SAELENS / case)
    assert type(dictionary) is kind and (dictionary.d, dictionary.n_concepts) == (16, 64)
    assert dictionary.origin == Origin(model="clip-b16", block=block)   # its metadata's timm repo, by catalog name
    assert_codes_and_reconstructions(dictionary, *(torch.from_numpy(reference[k])
                                                   for k in ("x", "codes", "reconstruction")))
    assert dictionary.normalisation.per_token == PER_TOKEN_CASES.get(case)


@pytest.mark.parametrize("case", list(PER_TOKEN_CASES))
def test_codes_of_a_per_token_normalised_dictionary_decode_only_beside_their_tokens(case, tmp_path):
    dictionary = concepts.load(SAELENS / case)
    x = torch.from_numpy(np.load(SAELENS / f"{case}.npz")["x"])
    codes = dictionary.encode(x)
    with pytest.raises(ConceptsError, match=r"decode back to raw activations only beside the tokens they came from"):
        dictionary.decode(codes)
    with pytest.raises(ConceptsError, match="The codes are of 32 tokens, the tokens given beside them 31"):
        dictionary.decode(codes, x[:31])
    with pytest.raises(ConceptsError, match="trained on 16-wide activations"):
        dictionary.decode(codes, x[:, :8])
    # the same tokens scaled: the same codes (each token's own statistics), the reconstruction scaled with them
    # (up to layer_norm's ε = 1e-5 beside spreads near 1.5)
    torch.testing.assert_close(dictionary.encode(3 * x), codes, atol=1e-4, rtol=0)
    torch.testing.assert_close(dictionary(3 * x), 3 * dictionary(x), atol=1e-4, rtol=0)
    assert not torch.allclose(dictionary(x), dictionary.decode(codes, 3 * x))   # the tokens beside them count
    loaded = concepts.load(concepts.save(dictionary, tmp_path / "saved.safetensors"))
    assert loaded.normalisation.per_token == PER_TOKEN_CASES[case]
    torch.testing.assert_close(loaded(x), dictionary(x), atol=0, rtol=0)


def test_a_saelens_dictionary_is_refused_on_another_model_or_block_naming_what_it_was_trained_on():
    dictionary = concepts.load(SAELENS / "topk")
    dictionary.check_applies(model="clip-b16", block=3, width=16, names=(catalog.CATALOG["clip-b16"].source,))
    with pytest.raises(ConceptsError, match=r"trained on clip-b16 block 4 \(index 3\), not on vit-base: pick clip-b16"):
        dictionary.check_applies(model="vit-base", block=3, width=16)
    with pytest.raises(ConceptsError, match=r"not on block 5 \(index 4\): read block 4 \(index 3\) to use it"):
        dictionary.check_applies(model="clip-b16", block=4, width=16)
    with pytest.raises(ConceptsError, match="trained on 16-wide activations .clip-b16 block 4 .index 3..; "
                                            "these are 768 wide"):
        dictionary.check_applies(model="clip-b16", block=3, width=768)


def test_a_saelens_jumprelu_saved_in_vitviz_file_loads_back_with_the_same_codes(tmp_path):
    dictionary = concepts.load(SAELENS / "batchtopk")
    loaded = concepts.load(concepts.save(dictionary, tmp_path / "jumprelu.safetensors"))
    assert type(loaded) is JumpReLU and loaded.origin == dictionary.origin
    x = torch.from_numpy(np.load(SAELENS / "batchtopk.npz")["x"])
    torch.testing.assert_close(loaded.encode(x), dictionary.encode(x), atol=0, rtol=0)


def saelens_copy(tmp_path: Path, case: str = "standard", *, cfg: dict | None = None,
                 tensors: dict | None = None) -> Path:
    """A copy of a sae-lens-written fixture folder with its cfg.json and tensors changed."""
    folder = tmp_path / case
    folder.mkdir(parents=True)
    config = json.loads((SAELENS / case / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps({**config, **(cfg or {})}))
    state = load_file(SAELENS / case / "sae_weights.safetensors")
    changed = {k: v for k, v in {**state, **(tensors or {})}.items() if v is not None}
    save_file(changed, folder / "sae_weights.safetensors")
    return folder


@pytest.mark.parametrize("change, words", [
    ({"normalize_activations": "expected_average_only_in"}, "expects its activations scaled by a factor not in the"),
    ({"normalize_activations": True}, "expects its activations scaled by a factor"),   # SAELens before 6
    ({"normalize_activations": "covariance_whitening"}, "whose constants are not in the folder"),
    ({"reshape_activations": "hook_z"}, "reads attention heads' outputs"),
    ({"architecture": "gated"}, "is a 'gated' one; vitviz reads standard, topk, jumprelu and batchtopk"),
    ({"architecture": "standard", "activation_fn": "tanh-relu"}, "activation is 'tanh-relu'"),
    ({"metadata": {"model_name": "gpt2", "hook_name": "blocks.3.hook_mlp_out"}},
     "trained on 'blocks.3.hook_mlp_out', which is not a block's output"),
    ({"metadata": {"hook_name": "blocks.0.hook_resid_pre"}}, "'blocks.0.hook_resid_pre', which is not a block's"),
    ({"d_sae": 65}, r"W_enc is 16 x 64, but its config \(d = 16, 65 concepts\) makes it 16 x 65"),
])
def test_saelens_settings_vitviz_cannot_reproduce_exactly_are_refused_in_words(tmp_path, change, words):
    with pytest.raises(ConceptsError, match=words):
        concepts.load(saelens_copy(tmp_path, cfg=change))


def test_saelens_before_6_topk_and_top_level_metadata_are_read(tmp_path):
    config = json.loads((SAELENS / "topk" / "cfg.json").read_text())
    old = {"d_in": 16, "d_sae": 64, "dtype": "torch.float64", "architecture": "standard", "activation_fn_str": "topk",
           "activation_fn_kwargs": {"k": config["k"]}, "hook_point": "blocks.3.hook_resid_post",
           "model_name": "timm/vit_base_patch16_clip_224.openai", "normalize_activations": False}
    folder = saelens_copy(tmp_path, "topk")
    (folder / "cfg.json").write_text(json.dumps(old))
    reference = np.load(SAELENS / "topk.npz")
    dictionary = concepts.load(folder)
    assert type(dictionary) is TopK and dictionary.k == config["k"] and dictionary.origin.block == 3
    assert_codes_and_reconstructions(dictionary, *(torch.from_numpy(reference[k])
                                                   for k in ("x", "codes", "reconstruction")))


def test_saelens_files_with_nan_missing_or_damaged_tensors_are_refused_in_words(tmp_path):
    nan = load_file(SAELENS / "standard" / "sae_weights.safetensors")["b_enc"].clone()
    nan[3] = float("nan")
    with pytest.raises(ConceptsError, match="holds NaN or infinite values in b_enc"):
        concepts.load(saelens_copy(tmp_path / "a", tensors={"b_enc": nan}))
    with pytest.raises(ConceptsError, match="has no b_dec, which a standard dictionary needs"):
        concepts.load(saelens_copy(tmp_path / "b", tensors={"b_dec": None}))
    with pytest.raises(ConceptsError, match="holds threshold, which a standard dictionary does not have"):
        concepts.load(saelens_copy(tmp_path / "c", tensors={"threshold": torch.zeros(64, dtype=torch.float64)}))
    folder = saelens_copy(tmp_path / "d")
    data = (folder / "sae_weights.safetensors").read_bytes()
    (folder / "sae_weights.safetensors").write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ConceptsError, match="sae_weights.safetensors is damaged or not a safetensors file"):
        concepts.load(folder)
    (folder / "cfg.json").write_text('{"d_in": 16,')
    with pytest.raises(ConceptsError, match="cfg.json is damaged: it is not valid JSON"):
        concepts.load(folder)


# ---- saev: sae.pt written here in its format, against its encoder's formulas -----------------------------------

def saev_file(path: Path, header: dict, state: dict) -> Path:
    """saev's `dump`: the header as one line of JSON, a newline, then torch.save of the state dict."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(json.dumps(header).encode() + b"\n" + buffer.getvalue())
    return path


def saev_reference(x, w, *, subtract_b_dec: bool, activation: str, top_k: int = K, threshold: float = 0.0):
    """saev's SparseAutoencoder: h = (x - b_dec) W_enc + b_enc before it stopped subtracting b_dec, x W_enc + b_enc
    after; Relu; TopK keeps the k largest of h as they are (mask · h); BatchTopK at inference h where h > θ
    (θ <= 0: ReLU); decode f W_dec + b_dec. Returns (codes, reconstruction)."""
    h = ((x - w["b_dec"]) if subtract_b_dec else x) @ w["W_enc"] + w["b_enc"]
    if activation == "Relu":
        f = torch.relu(h)
    elif activation == "TopK":
        mask = torch.zeros_like(h).scatter_(-1, h.topk(top_k, dim=-1).indices, 1.0)
        f = mask * h
    else:
        f = torch.where(h > threshold, h, torch.zeros_like(h)) if threshold > 0 else torch.relu(h)
    return f, f @ w["W_dec"] + w["b_dec"]


PRE_SCHEMA = {"d_vit": D, "exp_factor": N // D, "sparsity_coeff": 4e-4, "ghost_grads": False,
              "n_reinit_samples": 524288, "remove_parallel_grads": True, "normalize_w_dec": True, "seed": 0}


@pytest.mark.parametrize("header, activation, subtract", [
    (PRE_SCHEMA, "Relu", True),
    ({"schema": 1, "cls": "SparseAutoencoderConfig", "commit": "abc1234", "lib": "0.1.0",
      "cfg": {"d_vit": D, "exp_factor": N // D, "activation": {"cls": "Relu", "params": {}}}}, "Relu", False),
    ({"schema": 2, "cfg": {"d_vit": D, "exp_factor": N // D, "seed": 0,
                           "activation": {"cls": "TopK", "params": {"top_k": K}}}}, "TopK", False),
    ({"schema": 5, "cfg": {"d_model": D, "d_sae": N, "reinit_blend": 0.8,
                           "activation": {"cls": "BatchTopK", "params": {"top_k": K, "momentum": 0.1}}}},
     "BatchTopK", False),
], ids=["pre-schema relu", "schema 1 config class", "schema 2 topk", "schema 5 batchtopk"])
def test_saev_files_of_each_schema_encode_and_decode_as_saevs_code(tmp_path, header, activation, subtract):
    w = weights()
    state = dict(w)
    threshold = 0.45
    if activation == "BatchTopK":
        state["activation.threshold"] = torch.tensor(threshold, dtype=torch.float64)
    x = tokens()
    codes, reconstruction = saev_reference(x, w, subtract_b_dec=subtract, activation=activation, threshold=threshold)
    if activation == "TopK":   # saev keeps negative ones among the k largest; vitviz's codes are 0 there
        assert ((x @ w["W_enc"] + w["b_enc"]) > 0).sum(-1).min() >= K
    dictionary = concepts.load(saev_file(tmp_path / "sae.pt", header, state))
    assert type(dictionary) is {"Relu": Standard, "TopK": TopK, "BatchTopK": JumpReLU}[activation]
    assert dictionary.training_record == {"layout": "saev", "header": header}
    assert_codes_and_reconstructions(dictionary, x, codes, reconstruction)
    assert_codes_and_reconstructions(concepts.load(tmp_path), x, codes, reconstruction)   # the folder holding it


def test_saev_subtracting_b_dec_or_not_gives_different_codes_so_the_schema_decides():
    w, x = weights(), tokens()
    with_b_dec, _ = saev_reference(x, w, subtract_b_dec=True, activation="Relu")
    without, _ = saev_reference(x, w, subtract_b_dec=False, activation="Relu")
    assert (with_b_dec - without).abs().max() > 0.1   # the schema tests above would see a wrong choice


def test_saev_headers_vitviz_cannot_read_exactly_are_refused_in_words(tmp_path):
    state = weights()
    ambiguous = {"schema": 1, "cls": "Relu", "cfg": {"d_vit": D, "exp_factor": N // D}}
    with pytest.raises(ConceptsError, match="schema 1 with cls 'Relu', which saev wrote both while its encoder "
                                            "subtracted b_dec and after it stopped"):
        concepts.load(saev_file(tmp_path / "a.pt", ambiguous, state))
    with pytest.raises(ConceptsError, match="is of saev's schema 6; vitviz reads schemas up to 5"):
        concepts.load(saev_file(tmp_path / "b.pt", {"schema": 6, "cfg": {}}, state))
    matryoshka = {"schema": 5, "cfg": {"d_model": D, "d_sae": N, "activation": {"cls": "AbsBatchTopK", "params": {}}}}
    with pytest.raises(ConceptsError, match="has saev's 'AbsBatchTopK' activation"):
        concepts.load(saev_file(tmp_path / "c.pt", matryoshka, state))
    with pytest.raises(ConceptsError, match=r"W_enc is 10 x 40, but its config \(d = 10, 30 concepts\) makes it"):
        concepts.load(saev_file(tmp_path / "d.pt", {**PRE_SCHEMA, "exp_factor": 3}, state))


def test_saev_truncated_nan_and_code_holding_files_are_refused_and_no_code_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = saev_file(tmp_path / "sae.pt", PRE_SCHEMA, weights())
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConceptsError, match="is damaged or cut short"):
        concepts.load(tmp_path / "cut.pt")
    nan = weights()
    nan["W_dec"][0, 0] = float("nan")
    with pytest.raises(ConceptsError, match="holds NaN or infinite values in W_dec"):
        concepts.load(saev_file(tmp_path / "nan.pt", PRE_SCHEMA, nan))
    marker = tmp_path / "RAN"
    with pytest.raises(ConceptsError, match="is not tensors alone .* vitviz never runs code from a file"):
        concepts.load(saev_file(tmp_path / "code.pt", PRE_SCHEMA, {**weights(), "payload": CodeInPickle(marker)}))
    assert not marker.exists()
    (tmp_path / "header.pt").write_bytes(b'{"schema": 2, "cfg"\n' + data.partition(b"\n")[2])
    with pytest.raises(ConceptsError, match="its first line is not saev's JSON header"):
        concepts.load(tmp_path / "header.pt")


# ---- ViT-Prisma: config.json + .pt written here, against its encoder's formulas --------------------------------

def prisma_folder(folder: Path, *, config: dict | None = None, state: dict | None = None,
                  weights_name: str = "weights.pt") -> Path:
    """ViT-Prisma's files: save_config's config.json (the keys its loader reads) beside torch.save of the state."""
    folder.mkdir(parents=True, exist_ok=True)
    base = {"model_name": "open-clip:laion/CLIP-ViT-B-32-laion2B-s34B-b79K", "hook_point_layer": 11,
            "layer_subtype": "hook_resid_post", "d_in": D, "expansion_factor": N // D, "d_sae": None,
            "architecture": "standard", "activation_fn_str": "relu", "activation_fn_kwargs": {},
            "normalize_activations": "none", "cls_token_only": False, "use_patches_only": False,
            "dtype": {"__type__": "torch.dtype", "value": "torch.float32"}}
    (folder / "config.json").write_text(json.dumps({**base, **(config or {})}))
    torch.save(weights() if state is None else state, folder / weights_name)
    return folder


def prisma_reference(x, w, *, activation: str, k: int = K, norm: str = "none"):
    """ViT-Prisma's encode_standard and decoder: its run-time normalisation of each token (run_time_activation_ln_in
    and _out for layer_norm, run_time_activation_norm_fn_in and _out for constant_norm_rescale), then
    h = (x - b_dec) W_enc + b_enc; relu, or its TopK (the k largest through a ReLU); x̂ = f W_dec + b_dec, the
    normalisation undone with the statistics the input stored."""
    if norm == "layer_norm":
        mu = x.mean(dim=-1, keepdim=True)
        std = (x - mu).std(dim=-1, keepdim=True)
        sae_in, out = (x - mu) / (std + 1e-5), lambda y: y * std + mu
    elif norm == "constant_norm_rescale":
        coefficient = D ** 0.5 / x.norm(dim=-1, keepdim=True)
        sae_in, out = x * coefficient, lambda y: y / coefficient
    else:
        sae_in, out = x, lambda y: y
    h = (sae_in - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if activation == "relu":
        f = torch.relu(h)
    else:
        top = h.topk(k, dim=-1)
        f = torch.zeros_like(h).scatter_(-1, top.indices, torch.relu(top.values))
    return f, out(f @ w["W_dec"] + w["b_dec"])


@pytest.mark.parametrize("activation", ["relu", "topk"])
@pytest.mark.parametrize("norm", ["none", "layer_norm", "constant_norm_rescale"])
def test_prisma_files_encode_and_decode_as_prismas_code_with_their_model_block_and_tokens(tmp_path, activation,
                                                                                          norm):
    config = {"activation_fn_str": activation, "activation_fn_kwargs": {"k": K} if activation == "topk" else {},
              "normalize_activations": norm}
    folder = prisma_folder(tmp_path / "sae", config=config)
    w, x = weights(), tokens()
    codes, reconstruction = prisma_reference(x, w, activation=activation, norm=norm)
    for source in (folder, folder / "weights.pt"):
        dictionary = concepts.load(source)
        assert type(dictionary) is {"relu": Standard, "topk": TopK}[activation]
        assert dictionary.origin == Origin(model="clip-b32-laion", block=11, tokens="patch+cls")
        assert dictionary.normalisation.per_token == (None if norm == "none" else norm)
        assert_codes_and_reconstructions(dictionary, x, codes, reconstruction)


@pytest.mark.parametrize("config, tokens_kind, block", [({"cls_token_only": True}, "cls", 11),
                                                        ({"use_patches_only": True}, "patch", 11),
                                                        ({"layer_subtype": "hook_resid_pre", "hook_point_layer": [9]},
                                                         "patch+cls", 8)])
def test_prisma_origin_names_its_tokens_and_the_block_its_hook_reads(tmp_path, config, tokens_kind, block):
    dictionary = concepts.load(prisma_folder(tmp_path / "sae", config=config))
    assert (dictionary.origin.tokens, dictionary.origin.block) == (tokens_kind, block)


@dataclass
class PrismaConfig:   # ViT-Prisma's older save_model pickled its config object beside the state dict
    d_in: int = D


@pytest.mark.parametrize("config, state, words", [
    ({"normalize_activations": "expected_average_only_in"}, None,
     "normalises its activations by 'expected_average_only_in'; vitviz reads normalize_activations none, layer_norm"),
    ({"architecture": "gated"}, None, "is a 'gated' dictionary"),
    ({"activation_fn_str": "tanh-relu"}, None, "has the activation 'tanh-relu'"),
    ({"is_transcoder": True}, None, "is a transcoder"),
    ({"layer_subtype": "hook_mlp_out"}, None, "trained on 'blocks.11.hook_mlp_out', which is not a block's output"),
    ({}, {"cfg": PrismaConfig(), "state_dict": weights()}, "is not tensors alone"),
    ({}, {k: v for k, v in weights().items() if k != "b_enc"}, "has no b_enc"),
])
def test_prisma_files_vitviz_cannot_read_exactly_are_refused_in_words(tmp_path, config, state, words):
    folder = prisma_folder(tmp_path / "sae", config=config, state=state)
    with pytest.raises(ConceptsError, match=words):
        concepts.load(folder)


def test_a_prisma_config_naming_no_normalisation_gets_prismas_default_layer_norm(tmp_path):
    folder = prisma_folder(tmp_path / "sae")
    config = json.loads((folder / "config.json").read_text())
    del config["normalize_activations"]
    (folder / "config.json").write_text(json.dumps(config))
    dictionary, x = concepts.load(folder), tokens()
    assert dictionary.normalisation.per_token == "layer_norm"
    assert_codes_and_reconstructions(dictionary, x, *prisma_reference(x, weights(), activation="relu",
                                                                      norm="layer_norm"))


def test_a_prisma_pt_holding_code_is_refused_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "RAN"
    folder = prisma_folder(tmp_path / "sae", state={**weights(), "x": CodeInPickle(marker)})
    with pytest.raises(ConceptsError, match="vitviz never runs code from a file"):
        concepts.load(folder)
    assert not marker.exists()


# ---- from the Hub: repo ids, revisions, folders inside repos, catalog names ---------------------------------------

def publish_saelens(hub, repo: str) -> dict[str, bytes]:
    files = {".gitattributes": GITATTRIBUTES}
    for case in ("topk", "jumprelu"):
        files.update({f"blocks.3.hook_resid_post/{case}/{name}": data
                      for name, data in files_of(SAELENS / case).items()})
    hub.publish(repo, files)
    return files


def test_a_saelens_repo_of_several_dictionaries_loads_each_by_its_folder(hub):
    publish_saelens(hub, "test/saelens-suite")
    for case in ("topk", "jumprelu"):
        dictionary = concepts.load("test/saelens-suite", path_in_repo=f"blocks.3.hook_resid_post/{case}")
        reference = np.load(SAELENS / f"{case}.npz")
        assert_codes_and_reconstructions(dictionary, *(torch.from_numpy(reference[k])
                                                       for k in ("x", "codes", "reconstruction")))
    with pytest.raises(ConceptsError, match="holds no dictionary vitviz reads: it has none of across.json, "
                                            "concepts.safetensors, cfg.json, sae.pt, config.json. A repo of several "
                                            "dictionaries keeps"):
        concepts.load("test/saelens-suite")


def test_saev_prisma_and_vitviz_repos_load_by_id_and_revision(hub, tmp_path):
    saev = saev_file(tmp_path / "sae.pt", PRE_SCHEMA, weights())
    commit = hub.publish("test/saev", {".gitattributes": GITATTRIBUTES, "sae.pt": saev.read_bytes()})
    prisma = prisma_folder(tmp_path / "prisma", weights_name="n_images_2600058.pt")
    hub.publish("test/prisma", {".gitattributes": GITATTRIBUTES, **files_of(prisma)})
    own = concepts.save(concepts.load(SAELENS / "topk"), tmp_path / "own")
    hub.publish("test/own", {".gitattributes": GITATTRIBUTES, "concepts.safetensors": own.read_bytes()})
    for repo, local in (("test/saev", saev), (f"test/saev@{commit}", saev), ("test/prisma@main", prisma),
                        ("test/own", own)):
        loaded, reference = concepts.load(repo), concepts.load(local)
        assert type(loaded) is type(reference) and loaded.origin == reference.origin
        x = torch.randn(8, loaded.d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        torch.testing.assert_close(loaded.encode(x), reference.encode(x), atol=0, rtol=0)


def test_catalog_dictionaries_load_bound_to_their_model_block_and_tokens(hub, tmp_path):
    for name in ("saev-clip-b16", "prisma-clip-b32-block11"):
        entry = catalog.DICTIONARIES[name]
        files = (files_of(prisma_folder(tmp_path / name, weights_name=entry.path_in_repo,   # Prisma's default norm
                                        config={"normalize_activations": "layer_norm"})) if entry.path_in_repo
                 else {"sae.pt": saev_file(tmp_path / "sae.pt", PRE_SCHEMA, weights()).read_bytes()})
        hub.publish(entry.repo, {".gitattributes": GITATTRIBUTES, **files})
        dictionary = concepts.load(name)
        assert dictionary.origin == Origin(model=entry.model, block=entry.block, tokens=entry.tokens)
        assert dictionary.normalisation.per_token == ("layer_norm" if entry.path_in_repo else None)
        names = (catalog.CATALOG[entry.model].source,) if entry.model in catalog.CATALOG else ()
        dictionary.check_applies(model=entry.model, block=entry.block, width=D, names=names)
        block = f"block {entry.block + 1} .index {entry.block}."
        with pytest.raises(ConceptsError, match=f"trained on {entry.model} {block}, "
                                                f"patch.cls tokens, "
                                                f"not on vit-base"):
            dictionary.check_applies(model="vit-base", block=entry.block, width=D)
    assert set(catalog.DICTIONARIES) >= {"saev-clip-b16", "saev-dinov2-b14", "prisma-clip-b32-block11"}
    for entry in catalog.DICTIONARIES.values():   # bound to a model vitviz loads: a catalog name, else a Hub repo
        assert entry.model in catalog.CATALOG or "/" in entry.model


def test_a_downloaded_dictionary_loads_offline_from_the_cache_without_a_request(hub, tmp_path, monkeypatch):
    hub.publish("test/saev-offline", {".gitattributes": GITATTRIBUTES,
                                      "sae.pt": saev_file(tmp_path / "sae.pt", PRE_SCHEMA, weights()).read_bytes()})
    online = concepts.load("test/saev-offline")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    requests = hub.count()
    offline = concepts.load("test/saev-offline")
    assert hub.count() == requests
    torch.testing.assert_close(offline.encode(tokens()), online.encode(tokens()), atol=0, rtol=0)
    with pytest.raises(ConceptsError, match="'test/never-downloaded'.*offline mode.*not in the cache"):
        concepts.load("test/never-downloaded")


def test_a_dictionary_corrupted_in_transit_is_refused_removed_from_the_cache_and_downloads_again(hub):
    publish_saelens(hub, "test/saelens-corrupt")
    inside = "blocks.3.hook_resid_post/topk"
    hub.fail("test/saelens-corrupt", f"{inside}/sae_weights.safetensors", "corrupt", times=1)
    with pytest.raises(ConceptsError, match="sae_weights.safetensors of .* is damaged .*SHA-256.*removed from the"):
        concepts.load("test/saelens-corrupt", path_in_repo=inside)
    assert type(concepts.load("test/saelens-corrupt", path_in_repo=inside)) is TopK


@pytest.mark.parametrize("source, words", [
    ("https://huggingface.co/osunlp/SAE_CLIP_24K_ViT-B-16", "is neither a file or folder here nor a Hub repo id"),
    ("no-such-dictionary", "is neither a file or folder here nor a Hub repo id"),
    ("owner/name@bad..revision", "is neither a file or folder here nor a Hub repo id"),
    ("./missing/folder", "There is no file or folder './missing/folder'"),
    ("vit-base", "'vit-base' is a model, not a dictionary. The catalog's dictionaries are saev-clip-b16"),
])
def test_sources_that_are_neither_files_nor_repo_ids_are_refused_before_any_request(hub, source, words):
    requests = hub.count()
    with pytest.raises(ConceptsError, match=words):
        concepts.load(source)
    assert hub.count() == requests


def test_a_repo_the_hub_does_not_have_and_a_bad_path_in_repo_are_refused_in_words(hub):
    with pytest.raises(ConceptsError, match="'test/not-published' is not on the Hugging Face Hub"):
        concepts.load("test/not-published")
    with pytest.raises(ConceptsError, match="path_in_repo '../up' must be a path inside the repo"):
        concepts.load("test/not-published", path_in_repo="../up")
    with pytest.raises(ConceptsError, match="path_in_repo names a place inside a Hub repo"):
        concepts.load(SAELENS / "topk", path_in_repo="topk")
    with pytest.raises(ConceptsError, match="'saev-clip-b16' is a catalog dictionary, whose entry names its place"):
        concepts.load("saev-clip-b16", path_in_repo="sae.pt")
