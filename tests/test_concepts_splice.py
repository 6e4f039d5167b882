"""vitviz.concepts.analysis.splice: a dictionary spliced into its model, and one concept taken out.

The references never go through `forward_from`: the model's own forward with a forward hook that replaces
the block's output (what "the block's output replaced" means, computed by the plain forward), the KL worked
by hand and by scipy, and concept removal through a dictionary whose concepts are the signed coordinate axes,
so that removing one is a clamp of one coordinate.
"""
from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager

import pytest
import torch
from einops import rearrange
from scipy.stats import entropy

from vitviz import hub
from vitviz.concepts import ConceptsError, Origin, Standard, TopK
from vitviz.concepts.activations.cache import block_tokens
from vitviz.concepts.analysis.splice import (
    concept_effects,
    kl_divergence,
    site,
    splice,
    spliced_metrics,
    token_rows,
    without_concepts,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data(cifar10_test):
    return cifar10_test


def traced(name: str, data, count: int = 6):
    """A bundled model, its first `count` test images preprocessed, and their trace."""
    loaded = hub.load(name)
    pixels = torch.cat([loaded.preprocess(data.image(i)) for i in range(count)])
    with torch.inference_mode():
        return loaded, pixels, loaded.model.trace(pixels, attention=False)


def axes_dictionary(d: int, *, origin: Origin | None = None, seed: int = 0) -> Standard:
    """2d concepts, the signed coordinate axes (W_enc = [I, -I], W_dec = [I; -I]) behind a non-trivial
    normalisation: concept j < d is relu(x̃_j), concept d + j is relu(-x̃_j), so decode(encode(x)) = x."""
    g = torch.Generator().manual_seed(seed)
    dictionary = Standard(d, 2 * d, origin=origin or Origin())
    eye = torch.eye(d)
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.cat([eye, -eye], dim=1))
        dictionary.W_dec.copy_(torch.cat([eye, -eye], dim=0))
        dictionary.normalisation.offset.copy_(torch.randn(d, generator=g))
        dictionary.normalisation.scale.fill_(3.0)
    return dictionary.eval()


def random_dictionary(d: int, *, k: int = 8, expansion: int = 4, seed: int = 0) -> TopK:
    """A TopK dictionary with random weights: a poor reconstruction, so splicing it in moves the logits."""
    g = torch.Generator().manual_seed(seed)
    dictionary = TopK(d, expansion * d, k=k)
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.randn(d, expansion * d, generator=g))
        rows = torch.randn(expansion * d, d, generator=g)
        dictionary.W_dec.copy_(rows / rows.norm(dim=1, keepdim=True))
    return dictionary.eval()


def block_module(model, family: str, index: int):
    """Block `index` of `trace.blocks` as a module of the model."""
    if family == "vit":
        return model.blocks[index]
    if family == "cvt":
        return [block for stage in model.stages for block in stage.blocks][index]
    return [block for stage in model.stages for block in stage][index]   # resnet


@contextmanager
def replaced_output(loaded, index: int, change):
    """The model with block `index`'s output tokens (b n c) replaced by change(tokens), through a forward hook."""
    def hook(module, args, output):
        if loaded.family == "resnet":   # b c h w
            h, w = output.shape[2:]
            return rearrange(change(rearrange(output, 'b c h w -> b (h w) c')), 'b (h w) c -> b c h w', h=h, w=w)
        return (change(output[0]), *output[1:])
    handle = block_module(loaded.model, loaded.family, index).register_forward_hook(hook)
    try:
        yield loaded.model
    finally:
        handle.remove()


def rows_replaced(rows: torch.Tensor, by):
    """A change of a block's output: the given rows replaced by by(those rows), where the forward computed them (a
    ViT's last block computes only the rows its classifier reads)."""
    def change(tokens):
        tokens, computed = tokens.clone(), rows[rows < tokens.shape[1]]
        tokens[:, computed] = by(tokens[:, computed])
        return tokens
    return change


SPLICEABLE = [("vit-cifar10", 5, "patch"), ("vit-cifar10", -1, "patch+cls"), ("vit-cifar10", 2, "cls"),
              ("resnet-cifar10", 1, "position"), ("resnet-cifar10", -1, "position"),
              ("cvt-cifar10", 1, "patch"), ("cvt-cifar10", 4, "patch+cls"), ("cvt-cifar10", -1, "cls")]


@pytest.mark.parametrize("name, block, tokens", SPLICEABLE)
def test_a_dictionary_that_reconstructs_exactly_spliced_in_leaves_the_logits_unchanged(data, name, block, tokens):
    loaded, pixels, trace = traced(name, data)
    x = block_tokens(trace, block, tokens)
    exact = axes_dictionary(x.shape[-1])
    torch.testing.assert_close(exact(x), x, rtol=0, atol=1e-5)   # the premise: it does reconstruct exactly
    logits = splice(loaded, trace, exact, block=block, tokens=tokens)
    with torch.inference_mode():
        plain = loaded.model(pixels)
    torch.testing.assert_close(logits, trace.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name, block, tokens", SPLICEABLE)
def test_a_bad_dictionary_spliced_in_moves_the_logits_as_the_hooked_model_does(data, name, block, tokens):
    loaded, pixels, trace = traced(name, data)
    index = block % len(trace.blocks)
    bad = random_dictionary(trace.blocks[index].tokens.shape[-1])
    logits = splice(loaded, trace, bad, block=block, tokens=tokens)
    with replaced_output(loaded, index, rows_replaced(token_rows(trace.blocks[index], tokens), bad)) as model, \
            torch.inference_mode():
        hooked = model(pixels)
    torch.testing.assert_close(logits, hooked, rtol=0, atol=1e-4)
    assert (logits - trace.logits).abs().max() > 0.1


@pytest.mark.parametrize("tokens", ["patch", "cls", "patch+cls"])
def test_the_rows_spliced_are_the_tokens_the_dictionary_reads(data, tokens):
    _, _, trace = traced("vit-cifar10", data, count=2)
    out = trace.blocks[3]
    assert torch.equal(out.tokens[:, token_rows(out, tokens)], block_tokens(trace, 3, tokens))


def test_splicing_is_refused_in_words_where_the_next_block_reads_an_embedding_of_the_output(data):
    for name, block, able in [("swin-cifar10", 1, "0, 2, 4, 5, 6, 7, 8, 9"), ("cvt-cifar10", 2, "1, 3, 4, 5, 6, 7, 8")]:
        loaded, _, trace = traced(name, data, count=1)
        with pytest.raises(ConceptsError, match=rf"Block {block + 1} \(index {block}\) of {name} is the last of "
                                                rf"its stage.*Blocks that can be spliced \(indexes\): {able}\."):
            splice(loaded, trace, axes_dictionary(trace.blocks[block].tokens.shape[-1]), block=block)


@pytest.mark.parametrize("name", ["vit-cifar10", "cvt-cifar10"])
def test_patch_tokens_the_classifier_never_reads_are_refused_in_words(data, name):
    loaded, _, trace = traced(name, data, count=1)
    with pytest.raises(ConceptsError, match=r"does not read its patch tokens at all"):
        splice(loaded, trace, axes_dictionary(trace.blocks[-1].tokens.shape[-1]), block=-1, tokens="patch")


def test_a_dictionary_of_another_model_block_or_token_kind_is_refused_in_words(data):
    loaded, _, trace = traced("vit-cifar10", data, count=1)
    with pytest.raises(ConceptsError, match=r"trained on cvt-cifar10 block 5 \(index 4\), patch tokens, "
                                            r"not on vit-cifar10"):
        site(loaded, trace, axes_dictionary(192, origin=Origin(model="cvt-cifar10", block=4, tokens="patch")))
    with pytest.raises(ConceptsError, match=r"not on block 4 \(index 3\): read block 6 \(index 5\)"):
        site(loaded, trace, axes_dictionary(192, origin=Origin(model="vit-cifar10", block=5)), block=3)
    with pytest.raises(ConceptsError, match=r"not on cls tokens: read its patch tokens"):
        site(loaded, trace, axes_dictionary(192, origin=Origin(model="vit-cifar10", block=5, tokens="patch")),
             tokens="cls")
    found = site(loaded, trace, axes_dictionary(192, origin=Origin(model="vit-cifar10", block=5, tokens="patch")))
    assert (found.index, found.tokens, found.grid) == (5, "patch", (8, 8))


def test_kl_divergence_on_a_hand_worked_case():
    logits = torch.tensor([[0.0, math.log(2.0)], [1.0, 1.0]], dtype=torch.float64)   # p = (1/3, 2/3), (1/2, 1/2)
    spliced = torch.tensor([[5.0, 5.0], [1.0, 1.0]])                                  # q = (1/2, 1/2) twice
    kl = kl_divergence(logits, spliced)
    assert kl.dtype == torch.float64
    assert kl[0].item() == pytest.approx(1 / 3 * math.log(2 / 3) + 2 / 3 * math.log(4 / 3), rel=1e-12)
    assert kl[1].item() == 0.0


def test_spliced_metrics_over_a_data_set_equal_an_image_by_image_computation(data):
    loaded = hub.load("vit-cifar10")
    bad = random_dictionary(192, k=16, seed=3)
    broken = dataclasses.replace(data, source=lambda i: b"not an image" if i == 4 else data.source(i))
    indices = list(range(20))
    result = spliced_metrics(loaded, broken, bad, block=5, tokens="patch", indices=indices, batch_size=8,
                             progress=False)
    agree, kl, correct, spliced_correct = 0, 0.0, 0, 0
    for i in indices:
        if i == 4:
            continue
        pixels = loaded.preprocess(data.image(i))
        rows = torch.arange(1, 65)
        with torch.inference_mode():
            p = loaded.model(pixels).double().softmax(-1)[0]
            with replaced_output(loaded, 5, rows_replaced(rows, bad)) as model:
                q = model(pixels).double().softmax(-1)[0]
        agree += int(p.argmax() == q.argmax())
        kl += entropy(p.numpy(), q.numpy())
        correct += int(p.argmax() == data.labels[i])
        spliced_correct += int(q.argmax() == data.labels[i])
    assert (result.images, result.skipped, result.block, result.tokens) == (19, 1, 5, "patch")
    assert result.agreement == agree / 19 and result.agreement < 1
    assert result.kl == pytest.approx(kl / 19, rel=1e-4)
    assert (result.accuracy, result.spliced_accuracy) == (correct / 19, spliced_correct / 19)


def test_spliced_metrics_of_an_exact_dictionary_agree_everywhere(data):
    loaded = hub.load("resnet-cifar10")
    result = spliced_metrics(loaded, data, axes_dictionary(128), block=-1, indices=range(16), batch_size=16,
                             progress=False)
    assert result.agreement == 1.0 and result.kl < 1e-9 and result.accuracy == result.spliced_accuracy
    assert result.tokens == "position" and result.block == 5


def test_removing_an_axis_concept_clamps_its_coordinate_as_the_hooked_model_does(data):
    loaded, pixels, trace = traced("vit-cifar10", data, count=3)
    axes = axes_dictionary(192)
    offset = axes.normalisation.offset
    concepts = [3, 192 + 7, 50]
    logits = without_concepts(loaded, trace, axes, concepts=concepts, block=5, tokens="patch")
    assert logits.shape == (3, 3, 10)
    rows = torch.arange(1, 65)
    # concept j < d is scale · relu((x_j - offset_j) / scale) along axis j: removing it leaves min(x_j, offset_j);
    # concept d + j leaves max(x_j, offset_j)
    for number, (j, clamp) in enumerate([(3, torch.minimum), (7, torch.maximum), (50, torch.minimum)]):
        def clamped(tokens, j=j, clamp=clamp):
            tokens = tokens.clone()
            tokens[..., j] = clamp(tokens[..., j], offset[j])
            return tokens
        with replaced_output(loaded, 5, rows_replaced(rows, clamped)) as model, torch.inference_mode():
            reference = model(pixels)
        torch.testing.assert_close(logits[:, number], reference, rtol=0, atol=1e-4)


@pytest.mark.parametrize("per_token", [None, "layer_norm", "constant_norm_rescale"])
def test_removing_a_concept_subtracts_its_part_and_keeps_the_reconstruction_error(data, per_token):
    loaded, pixels, trace = traced("resnet-cifar10", data, count=2)
    bad = random_dictionary(128, k=32, seed=5)
    if per_token:   # SAELens's and ViT-Prisma's normalisations of each token by its own statistics
        bad.normalise_each_token(per_token)
    x = trace.blocks[-1].tokens
    codes = bad.encode(x).detach()
    concept = int(codes.sum((0, 1)).argmax())   # one that fires on these images
    logits = without_concepts(loaded, trace, bad, concepts=[concept], block=-1)
    with torch.no_grad():   # its part: the reconstruction with the concept less the one without it
        part = bad.decode(codes, x) - bad.decode(codes * (torch.arange(bad.n_concepts) != concept), x)
    if per_token is None:
        expected = bad.normalisation.scale * codes[..., concept, None] * bad.W_dec[concept].detach()
        torch.testing.assert_close(part, expected, rtol=0, atol=1e-5)
    with replaced_output(loaded, 5, lambda tokens: tokens - part) as model, torch.inference_mode():
        reference = model(pixels)
    torch.testing.assert_close(logits[:, 0], reference, rtol=0, atol=1e-4)
    assert (logits[:, 0] - trace.logits).abs().max() > 1e-3


def test_concept_effects_change_the_target_only_through_the_concepts_that_fire(data):
    loaded, pixels, trace = traced("resnet-cifar10", data, count=1)
    bad = random_dictionary(128, k=32, seed=5)
    codes = bad.encode(trace.blocks[-1].tokens)[0]
    fired = codes.sum(0) > 0
    concepts = [int(fired.nonzero()[0]), int((~fired).nonzero()[0]), int(codes.sum(0).argmax())]
    effects = concept_effects(loaded, trace, bad, concepts=concepts, block=-1)
    target = int(trace.logits.argmax())
    assert effects.target == target
    assert effects.logit == pytest.approx(float(trace.logits[0, target]), abs=1e-4)
    assert effects.probability == pytest.approx(float(trace.logits.softmax(-1)[0, target]), abs=1e-5)
    removed = without_concepts(loaded, trace, bad, concepts=concepts, block=-1)[0]
    torch.testing.assert_close(effects.logits, removed[:, target], rtol=0, atol=1e-4)
    torch.testing.assert_close(effects.probabilities, removed.softmax(-1)[:, target], rtol=0, atol=1e-5)
    assert torch.equal(effects.predictions, removed.argmax(-1))
    assert effects.logit_change[1] == 0 and effects.probability_change[1] == 0   # it does not fire: no change
    assert effects.logit_change[2] != 0
    other = concept_effects(loaded, trace, bad, concepts=concepts, target=(target + 1) % 10, block=-1)
    assert other.target == (target + 1) % 10
