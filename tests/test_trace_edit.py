"""`trace(edit=...)`, pixels that carry a graph, and frozen attention: what circuits and feature pictures build on."""
import pytest
import torch

from tiny_models import FAMILIES, tiny
from vitviz.concepts.analysis.splice import spliceable
from vitviz.models.relevance import frozen_attention


@pytest.mark.parametrize("family", FAMILIES)
def test_an_identity_edit_changes_nothing_and_every_block_is_offered_once(family):
    model, pixels = tiny(family), torch.randn(2, 3, 32, 32)
    seen = []
    trace = model.trace(pixels, attention=False, edit=lambda i, tokens: seen.append(i) or tokens)
    assert seen == list(range(len(trace.blocks)))
    torch.testing.assert_close(trace.logits, model(pixels), rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_edited_block_is_what_the_rest_of_the_forward_reads(family):
    """Adding a change to a block's output inside the trace gives the logits of `forward_from` on the changed
    tokens, and the trace keeps the changed tokens as that block's."""
    model, pixels = tiny(family), torch.randn(2, 3, 32, 32)
    plain = model.trace(pixels, attention=False)
    index = max(i for i in range(len(plain.blocks) - 1) if spliceable(plain, i))
    change = torch.randn_like(plain.blocks[index].tokens)
    trace = model.trace(pixels, attention=False, edit=lambda i, tokens: tokens + change if i == index else tokens)
    changed = plain.blocks[index].tokens + change
    torch.testing.assert_close(trace.blocks[index].tokens, changed)
    expected = model.forward_from(index + 1, changed, plain.blocks[index].query_grid)
    torch.testing.assert_close(trace.logits, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(trace.logits, plain.logits, atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_pixels_that_carry_a_graph_keep_it(family):
    """A feature picture's pixels come from parameters: the trace's gradient reaches them."""
    model = tiny(family)
    parameters = torch.randn(1, 3, 32, 32, requires_grad=True)
    trace = model.trace(torch.sigmoid(parameters), grad=True, attention=False)
    trace.logits[0, 1].backward()
    assert parameters.grad is not None and parameters.grad.abs().sum() > 0


def test_frozen_attention_is_the_gradient_with_every_pattern_held_constant():
    """Under `frozen_attention` a ViT block's vector-Jacobian product is that of the block with its attention
    pattern replaced by the constant it had on this input (computed here from the block's own parts)."""
    block = tiny("vit").blocks[0]
    x = torch.randn(1, 17, 16)
    _, attn, _, _ = block(x, return_attn=True)
    attn = attn.detach()

    def constant_pattern(tokens):
        from einops import rearrange
        q, k, v = rearrange(block.attn.qkv(block.norm1(tokens)), 'b n (three h d) -> three b h n d', three=3,
                            h=block.attn.heads)
        out = block.attn.proj(rearrange(attn @ v, 'b h n d -> b n (h d)'))
        tokens = tokens + block.ls1(out)
        return tokens + block.ls2(block.mlp(block.norm2(tokens)))

    cotangent = torch.randn(1, 17, 16)

    def vjp(function) -> torch.Tensor:
        tokens = x.clone().requires_grad_(True)
        return torch.autograd.grad((function(tokens) * cotangent).sum(), tokens)[0]

    with frozen_attention():
        frozen = vjp(lambda t: block(t)[0])
    torch.testing.assert_close(frozen, vjp(constant_pattern), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(vjp(lambda t: block(t)[0]), frozen, atol=1e-4)
