"""Vision Transformer (Dosovitskiy et al. 2020), with DeiT distillation, register tokens and CLIP's image tower.

Parameter names are timm's (`patch_embed.proj`, `blocks.i.attn.qkv`, `norm`, `head`, ...), so a
timm `VisionTransformer` / `VisionTransformerDistilled` state dict loads 1:1. The layers come from
`relevance.py`: torch's own, unless relevance rules (AttnLRP) are switched on for one pass. CLIP's
image tower (Radford et al. 2021) is this ViT with a LayerNorm before the blocks, LayerNorm eps 1e-5,
no patch-embedding bias and, for OpenAI's weights, QuickGELU (timm's `vit_*_clip_*` models); its
projection into the joint space, the text tower and the zero-shot head live in `clip.py`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .relevance import GELU, GammaConv2d, GammaLinear, LayerNorm, QuickGELU, attention_inputs
from .trace import (
    AttentionParts,
    BlockTrace,
    Edit,
    Embedding,
    KeptAttention,
    Trace,
    Window,
    edited,
    graph_pixels,
    graph_start,
    kept_blocks,
    kept_units,
)

LN_EPS = 1e-6
ACTIVATIONS = {"gelu": GELU, "quick_gelu": QuickGELU}   # the MLP's, by timm's `act_layer` names


@dataclass(frozen=True)
class ViTConfig:
    """A ViT's architecture as timm's `VisionTransformer` arguments name it: size, patches, width and
    depth, its prefix tokens (class, distillation, registers), pooling and normalisation choices."""
    img_size: tuple[int, int] = (224, 224)   # the size pos_embed was trained for
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000        # 0: no classifier (self-supervised DINO / DINOv2), head Identity as in timm
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    class_token: bool = True
    dist_token: bool = False       # DeiT distillation token + head_dist
    reg_tokens: int = 0            # "Vision Transformers Need Registers"
    no_embed_class: bool = False   # pos_embed covers the patches only, added before the prefix
    global_pool: str = "token"     # 'token' (class token) or 'avg' (mean of the patch tokens)
    fc_norm: bool | None = None    # None: timm's rule, final norm after pooling iff global_pool == 'avg'
    init_values: float | None = None  # LayerScale
    # CLIP's image tower (timm's `vit_*_clip_*`, open_clip's VisionTransformer)
    pre_norm: bool = False         # a LayerNorm before the first block (timm `norm_pre`); no patch-embedding bias then
    act: str = "gelu"              # 'gelu', or 'quick_gelu' x sigmoid(1.702 x) (OpenAI's CLIP weights)
    ln_eps: float = LN_EPS         # CLIP's LayerNorms: 1e-5

    def __post_init__(self):
        object.__setattr__(self, "img_size", tuple(self.img_size))
        if self.global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', not {self.global_pool!r}")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs a class token")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {sorted(ACTIVATIONS)}, not {self.act!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")

    @property
    def use_fc_norm(self) -> bool:
        return self.global_pool == "avg" if self.fc_norm is None else self.fc_norm

    @property
    def prefix_kinds(self) -> tuple[str, ...]:
        # timm's order: [cls, dist] for DeiT, [cls, reg...] for register models
        return ("cls",) * self.class_token + ("dist",) * self.dist_token + ("reg",) * self.reg_tokens

    def to_dict(self) -> dict:
        return asdict(self)


def resample_pos_embed(pos_embed: Tensor, new_grid: tuple[int, int], old_grid: tuple[int, int],
                       num_prefix: int) -> Tensor:
    """timm's `resample_abs_pos_embed`: bicubic (antialiased) on the grid part, prefix slots kept."""
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    grid = rearrange(grid.float(), '1 (h w) c -> 1 c h w', h=old_grid[0], w=old_grid[1])
    grid = F.interpolate(grid, size=new_grid, mode="bicubic", antialias=True)
    grid = rearrange(grid, '1 c h w -> 1 (h w) c').to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1)


class Attention(nn.Module):
    """Multi-head self-attention over all tokens (timm's `attn.qkv`, `attn.proj`), with its attention
    matrix handed back when asked for."""
    def __init__(self, *, dim: int, heads: int, qkv_bias: bool):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, return_attn: bool = False,
                queries: int | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
        """-> (output, attention b h nq n or None, the values b h n d it weighed, for decompositions); queries:
        only the first that many tokens attend (all by default); every token is still a key."""
        q, k, values = rearrange(self.qkv(x), 'b n (three h d) -> three b h n d', three=3, h=self.heads)
        q, k, v = attention_inputs(q, k, values)
        q = q[:, :, :queries]
        if return_attn:
            attn = (q * self.scale @ k.transpose(-2, -1)).softmax(dim=-1)   # b h n n
            out = attn @ v
        else:
            attn, out = None, F.scaled_dot_product_attention(q, k, v)
        return self.proj(rearrange(out, 'b h n d -> b n (h d)')), attn, values


class LayerScale(nn.Module):
    """A learnt per-channel scale on a block's update (CaiT's LayerScale, as DINOv2 uses it)."""
    def __init__(self, *, dim: int, init_values: float):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """The block's two-layer MLP: `fc1`, the activation, `fc2`."""
    def __init__(self, *, dim: int, hidden_dim: int, act: str = "gelu"):
        super().__init__()
        self.fc1 = GammaLinear(dim, hidden_dim)
        self.act = ACTIVATIONS[act]()
        self.fc2 = GammaLinear(hidden_dim, dim)

    def forward(self, x: Tensor, units: list[Tensor] | None = None) -> Tensor:
        """x -> fc2(act(fc1(x))); `units`: where a list is given, act(fc1(x)) is appended to it (as
        `models.layers.Mlp`)."""
        return self.fc2(kept_units(self.act(self.fc1(x)), units))


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)), each update optionally
    scaled by LayerScale."""
    def __init__(self, *, dim: int, heads: int, mlp_ratio: float, qkv_bias: bool, init_values: float | None,
                 act: str = "gelu", eps: float = LN_EPS):
        super().__init__()
        scale = (lambda: LayerScale(dim=dim, init_values=init_values)) if init_values else nn.Identity
        self.norm1 = LayerNorm(dim, eps=eps)
        self.attn = Attention(dim=dim, heads=heads, qkv_bias=qkv_bias)
        self.ls1 = scale()
        self.norm2 = LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim=dim, hidden_dim=int(dim * mlp_ratio), act=act)
        self.ls2 = scale()

    def forward(self, x: Tensor, return_attn: bool = False, queries: int | None = None,
                attn_delta: Tensor | None = None, units: list[Tensor] | None = None
                ) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """-> (output tokens, attention or None, first norm's output, the attention's values); queries: compute
        only the first that many tokens' outputs (all by default); attn_delta: added to the attention's output
        (activation patching); units: where a list is given, the MLP's hidden units are appended to it."""
        normed = self.norm1(x)
        out, attn, values = self.attn(normed, return_attn, queries)
        x = x[:, :queries] + self.ls1(out)
        if attn_delta is not None:
            x = x + attn_delta[:, :queries]
        return x + self.ls2(self.mlp(self.norm2(x), units)), attn, normed, values

    def parts(self, values: Tensor) -> AttentionParts:
        """How the heads write, from the values the attention weighed (LayerScale folded into the projection)."""
        weight, bias = self.attn.proj.weight, self.attn.proj.bias
        if isinstance(self.ls1, LayerScale):
            weight, bias = self.ls1.gamma[:, None] * weight, self.ls1.gamma * bias
        return AttentionParts(values=values, weight=weight, bias=bias)


class PatchEmbed(nn.Module):
    """Non-overlapping patches to tokens: one convolution with kernel and stride the patch size."""
    def __init__(self, *, patch_size: int, in_chans: int, dim: int, bias: bool = True):
        super().__init__()
        self.proj = GammaConv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.proj(pixels)   # b c h w


class ViT(nn.Module):
    """Vision Transformer: patches and prefix tokens with position embeddings through the blocks, the
    final norm and the classifier; `model(pixels)` gives logits, `model.trace(pixels)` a `Trace`."""
    def __init__(self, config: ViTConfig):
        super().__init__()
        c = self.config = config
        self.num_prefix = len(c.prefix_kinds)
        self.grid = (c.img_size[0] // c.patch_size, c.img_size[1] // c.patch_size)
        self.patch_embed = PatchEmbed(patch_size=c.patch_size, in_chans=c.in_chans, dim=c.embed_dim,
                                      bias=not c.pre_norm)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim)) if c.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim)) if c.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, c.reg_tokens, c.embed_dim)) if c.reg_tokens else None
        pos_slots = self.grid[0] * self.grid[1] + (0 if c.no_embed_class else self.num_prefix)
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_slots, c.embed_dim))
        if not self.pos_embed.is_meta:   # drawn here, before the blocks: the random stream the bundled ViT began with
            nn.init.normal_(self.pos_embed, std=0.02)
        self.norm_pre = LayerNorm(c.embed_dim, eps=c.ln_eps) if c.pre_norm else nn.Identity()
        self.blocks = nn.ModuleList([
            Block(dim=c.embed_dim, heads=c.num_heads, mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias,
                  init_values=c.init_values, act=c.act, eps=c.ln_eps)
            for _ in range(c.depth)])
        self.norm = nn.Identity() if c.use_fc_norm else LayerNorm(c.embed_dim, eps=c.ln_eps)
        self.fc_norm = LayerNorm(c.embed_dim, eps=c.ln_eps) if c.use_fc_norm else nn.Identity()
        self.head = GammaLinear(c.embed_dim, c.num_classes) if c.num_classes else nn.Identity()
        self.head_dist = (GammaLinear(c.embed_dim, c.num_classes) if c.num_classes else nn.Identity()) \
            if c.dist_token else None
        self._init_weights()

    def _init_weights(self):
        if self.pos_embed.is_meta:
            # built on the meta device to be loaded (hub.py, bundle.py): nothing to draw, and a normal draw there
            # goes through torch's Python refs, which import torch._dynamo (1.4 s) on the first load
            return
        for token in (self.cls_token, self.dist_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6 if token is self.cls_token else 0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias) if m.bias is not None else None

    def embed(self, pixels: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """pixels -> tokens [prefix..., patches] with positions (through `norm_pre`), and the patch grid."""
        x = self.patch_embed(pixels)
        grid = (x.shape[2], x.shape[3])
        x = rearrange(x, 'b c h w -> b (h w) c')
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token)
                  if t is not None]
        no_embed_class = self.config.no_embed_class
        pos = resample_pos_embed(self.pos_embed, grid, self.grid, 0 if no_embed_class else self.num_prefix)
        tokens = torch.cat(prefix + [x + pos], dim=1) if no_embed_class else torch.cat(prefix + [x], dim=1) + pos
        return self.norm_pre(tokens), grid

    def pre_logits(self, x: Tensor) -> Tensor:
        """Final-norm'd tokens -> what the classifier reads, b c (timm's `forward_head(pre_logits=True)`): the
        class token, or the grid mean through fc_norm; DeiT's distilled model: its two tokens' mean."""
        if self.config.global_pool == "avg":
            return self.fc_norm(x[:, self.num_prefix:].mean(dim=1))
        if self.head_dist is not None:
            return (x[:, 0] + x[:, 1]) / 2
        return self.fc_norm(x[:, 0])

    def head_logits(self, x: Tensor) -> Tensor:
        """Final-norm'd tokens -> logits (DeiT: the mean of the class and distillation heads). Without a
        classifier the heads are Identity, so this is `pre_logits`, as timm's forward returns."""
        if self.head_dist is None or self.config.global_pool == "avg" or not self.config.num_classes:
            return self.head(self.pre_logits(x))
        return (self.head(self.fc_norm(x[:, 0])) + self.head_dist(x[:, 1])) / 2

    def pooled_logits(self, tokens: Tensor) -> Tensor:
        """Any block's b n c tokens -> logits of their mean (prefix tokens included) through the final norm and
        the classifier (DeiT: the mean of both heads): LeGrad's per-layer score."""
        pooled = self.fc_norm(self.norm(tokens.mean(dim=1)))   # one of the two is the final norm, the other Identity
        logits = self.head(pooled)
        if self.head_dist is not None:
            logits = (logits + self.head_dist(pooled)) / 2
        return logits

    def embeddings(self, input_size: tuple[int, int]) -> list[Embedding]:
        """The patch embedding's geometry for pixels of `input_size` (h, w), as `trace` reports it."""
        p = self.config.patch_size
        return [Embedding(Window(p, p, 0), tuple(input_size), (input_size[0] // p, input_size[1] // p))]

    def forward(self, pixels: Tensor) -> Tensor:
        """pixels -> logits, as timm's forward: a model without a classifier returns its pooled features."""
        x, _ = self.embed(pixels)
        # the head reads the class (and distillation) token alone unless it averages the grid, so the last
        # block computes only those rows: about 6% of a ViT-B/16 forward that timm spends on discarded tokens
        read = None if self.config.global_pool == "avg" else 1 + self.config.dist_token
        for i, block in enumerate(self.blocks):
            x = block(x, queries=read if i == len(self.blocks) - 1 else None)[0]
        return self.head_logits(self.norm(x))

    def forward_from(self, index: int, tokens: Tensor, grid: tuple[int, int] | None = None, *,
                     attn_delta: Tensor | None = None) -> Tensor:
        """The residual stream entering block `index` (b n c) -> logits: the rest of the forward, for activation
        patching (`attn_delta` added to that block's attention output); index = depth: the classifier alone.
        `grid` is not needed (CvT's is). As in `forward`, the last block computes only the rows the head reads."""
        read = None if self.config.global_pool == "avg" else 1 + self.config.dist_token
        for i in range(index, len(self.blocks)):
            tokens = self.blocks[i](tokens, queries=read if i == len(self.blocks) - 1 else None,
                                    attn_delta=attn_delta if i == index else None)[0]
        return self.head_logits(self.norm(tokens))

    def trace(self, pixels: Tensor, *, grad: bool = False, decompose: bool = False,
              attention: KeptAttention = True, edit: Edit | None = None, units: bool = False) -> Trace:
        """One forward pass that returns every attention map and block output.

        With grad=True the graph is kept, so `torch.autograd.grad(logit, trace.attentions)` works. A model
        without a classifier has no logits (b 0): its output is `trace.pooled`. decompose=True: each block
        also keeps how its heads write (`BlockTrace.parts`, for direct logit attribution). attention=False: no
        attention maps (`attn` None) and the fused attention kernel, for work that reads only the tokens (CKA).
        attention=slice(...): the maps of those blocks only, and with grad=True the graph from the first of them
        on (LeGrad reading the last blocks; `models.trace.graph_start`).
        edit: `models.trace.Edit`, each block's output tokens replaced before the rest of the forward reads
        them (circuits splice dictionaries in this way).
        units=True: each block also keeps its MLP's hidden units (`BlockTrace.hidden`, for feature pictures).
        """
        kept = kept_blocks(attention, len(self.blocks))
        graph_from = graph_start(attention, kept)
        with torch.set_grad_enabled(grad):
            if grad and not graph_from:
                pixels = graph_pixels(pixels)
            with torch.set_grad_enabled(grad and not graph_from):
                x, grid = self.embed(pixels)
            blocks = []
            for i, block in enumerate(self.blocks):
                inputs, hidden = x, [] if units else None
                with torch.set_grad_enabled(grad and i >= graph_from):
                    x, attn, normed, values = block(x, return_attn=i in kept, units=hidden)
                    x = edited(edit, i, x)
                blocks.append(BlockTrace(attn=attn, tokens=x, stage=0, query_grid=grid, key_grid=grid,
                                         key_window=Window(1, 1, 0), prefix_kinds=self.config.prefix_kinds,
                                         normed=normed if grad else None, inputs=inputs,
                                         parts=block.parts(values) if decompose else None,
                                         hidden=hidden[0] if units else None))
            final = self.norm(x)
            pooled = self.pre_logits(final)
            logits = self.head_logits(final) if self.config.num_classes else pooled.new_zeros(pooled.shape[0], 0)
        features = rearrange(x[:, self.num_prefix:], 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        in_grid = (pixels.shape[2], pixels.shape[3])
        return Trace(logits=logits, blocks=blocks, embeddings=self.embeddings(in_grid), features=[features],
                     input_size=in_grid, pooled=pooled, final_tokens=final,
                     pixels=pixels if grad and not graph_from else None)

