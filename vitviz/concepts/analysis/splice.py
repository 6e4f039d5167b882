"""A dictionary inside its model: spliced in (how much of what the model does survives the reconstruction), and
one concept taken out (what that concept decides).

Spliced in. Block L's output tokens x (`resid_post`, the rows the dictionary reads: `activations.cache.TOKENS`) are
replaced by their reconstruction x̂ = decode(encode(x)); the other rows (a patch dictionary's class token)
stay as they were, and the rest of the model runs on the result (`model.forward_from(L + 1, ...)`). Over N
images, with p the unspliced model's prediction and q the spliced one's (softmax of the logits):

    agreement        = (1/N) #{images : argmax p = argmax q}
    KL               = (1/N) Σ_images Σ_c p_c (log p_c - log q_c)       KL(p ‖ q), natural log, in float64
    accuracy         = (1/N') #{labelled images : argmax p = label}     N' the images whose label is a model class
    spliced accuracy = the same for argmax q

(The KL that language-model SAE evaluations report beside the cross-entropy "loss recovered": it compares
the spliced prediction with the model's own, not with the labels, so it needs none.)

Concept removal. With codes z = encode(x) of one read token, concept i's part of x in raw activation space is
scale · z_i W_dec[i] (`kinds/dictionary.py`: x̂ - offset = scale · (b_dec + Σ_i z_i W_dec[i]); for a dictionary that
normalises each token by its own statistics, scale is that token's σ_x or ‖x‖ / √d), and removing it gives

    x_without_i = x - scale · z_i W_dec[i]           at every read token (each with its own z_i and scale)

subtracted from the true output, not from the reconstruction, so the reconstruction error x - x̂ is kept and
a concept that does not fire on the photo changes nothing. The rest of the model runs on x_without_i.

Where a block can be spliced. The rest of the forward starts from the residual stream entering block L + 1,
so block L's output must be exactly what block L + 1 reads: true inside a stage and for a ResNet's blocks
(even the one that halves the grid: it reads the previous block's output), not for the last block of a
CvT, Swin or ConvNeXt stage, whose output goes through the next stage's embedding or downsampling first.
The trace says which: `trace.blocks[L + 1].inputs` equals `trace.blocks[L].tokens`. The last block can
always be spliced (the classifier alone follows). And the rows replaced must be read by what follows: the
classifier of a ViT with a class token and of a CvT reads the last block's class token alone, so a patch
dictionary of that block changes no prediction. That is refused in words too, found by running the rest of
the model once with the rows' signs flipped: logits equal to the last bit mean the rows are not read.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import torch
from PIL import Image
from torch import Tensor
from tqdm import tqdm

from ...data import Dataset, class_positions
from ...explain.gradients import Target, resolve_target
from ...image import ImageError
from ...models.trace import BlockTrace, Trace
from ..activations.cache import block_index, check_tokens, default_tokens
from ..kinds.dictionary import ConceptsError, Dictionary, block_words


@dataclass(frozen=True)
class Site:
    """Where a dictionary goes into a model: block `index` of the trace (counted from 0), the `tokens` kind it
    reads and their `rows` in the block's output (class token first, as `activations.cache.block_tokens` orders
    them), and the `grid` the rest of the forward starts on."""
    index: int
    tokens: str
    rows: Tensor        # long
    grid: tuple[int, int]


def token_rows(block: BlockTrace, tokens: str) -> Tensor:
    """The rows of `block.tokens` that a dictionary of `tokens` kind reads, in `activations.cache.block_tokens`'
    order."""
    grid = list(range(block.prefix, block.tokens.shape[1])) if tokens != "cls" else []
    cls = [block.prefix_kinds.index("cls")] if "cls" in tokens else []
    return torch.tensor(cls + grid, dtype=torch.long, device=block.tokens.device)


def spliceable(trace: Trace, index: int) -> bool:
    """Whether block `index`'s output is exactly what the next block reads (or it is the last block)."""
    if index == len(trace.blocks) - 1:
        return True
    out, following = trace.blocks[index].tokens, trace.blocks[index + 1].inputs
    return following is not None and following.shape == out.shape and torch.equal(following, out)


def site(loaded, trace: Trace, dictionary: Dictionary, *, block: int | None = None,
         tokens: str | None = None) -> Site:
    """Where `dictionary` goes into the model `trace` came from: `block` (default the dictionary's own) and
    `tokens` (default the dictionary's, else the block's grid tokens), checked against what the dictionary was
    trained on, and refused in words where the rest of the model cannot be run from that block's output or does
    not read those tokens (the module docstring says when)."""
    if block is None:
        block = dictionary.block
        if block is None:
            raise ConceptsError("This dictionary does not record the block it was trained on: say which block "
                                "of the model it reads.")
    index = block_index(trace, block)
    out = trace.blocks[index]
    trained_on = dictionary.origin.tokens
    tokens = tokens or trained_on or default_tokens(out)
    if trained_on is not None and tokens != trained_on:
        raise ConceptsError(f"This dictionary was trained on {dictionary.origin.describe()}, not on {tokens} "
                            f"tokens: read its {trained_on} tokens.")
    check_tokens(out, tokens, index)
    dictionary.check_applies(model=loaded.name, block=index, width=out.tokens.shape[-1],
                             names=(loaded.source.location,))
    if not spliceable(trace, index):
        able = [i for i in range(len(trace.blocks)) if spliceable(trace, i)]
        raise ConceptsError(f"{block_words(index).capitalize()} of {loaded.name} is the last of its stage: the next "
                            f"block reads its output only through the next stage's embedding or downsampling, so the "
                            f"model cannot go on from a replaced output of it. Blocks that can be spliced (indexes): "
                            f"{', '.join(map(str, able))}.")
    found = Site(index=index, tokens=tokens, rows=token_rows(out, tokens), grid=out.query_grid)
    _check_read(loaded.model, out.tokens[:1], found, loaded.name)
    return found


def _check_read(model, x: Tensor, at: Site, name: str) -> None:
    """Refuses a site whose rows the rest of the model does not read: flipping their signs changes no logit."""
    flipped = x.clone()
    flipped[:, at.rows] = -flipped[:, at.rows]
    with torch.inference_mode():
        logits = model.forward_from(at.index + 1, torch.cat([x, flipped]), at.grid)
    if torch.equal(logits[0], logits[1]):
        raise ConceptsError(f"What follows {block_words(at.index)} of {name} does not read its {at.tokens} tokens "
                            f"at all (its classifier reads only other tokens, such as the class token), so replacing "
                            f"them cannot change a prediction: use a dictionary of an earlier block, or of the tokens "
                            f"the classifier reads.")


@torch.inference_mode()
def reconstructed(x: Tensor, dictionary: Dictionary, at: Site) -> Tensor:
    """Block output tokens x (b n d) with the rows the dictionary reads replaced by decode(encode(rows))."""
    spliced = x.clone()
    spliced[:, at.rows] = dictionary(x[:, at.rows]).to(device=x.device, dtype=x.dtype)
    return spliced


def splice(loaded, trace: Trace, dictionary: Dictionary, *, block: int | None = None,
           tokens: str | None = None) -> Tensor:
    """b classes: the logits of the model `trace` came from with `dictionary`'s reconstruction spliced in at
    `block` (see `site` for the defaults)."""
    at = site(loaded, trace, dictionary, block=block, tokens=tokens)
    with torch.inference_mode():
        return loaded.model.forward_from(at.index + 1, reconstructed(trace.blocks[at.index].tokens, dictionary, at),
                                         at.grid)


def kl_divergence(logits: Tensor, spliced: Tensor) -> Tensor:
    """b: KL(p ‖ q) = Σ_c p_c (log p_c - log q_c) in nats, float64, p = softmax(`logits`), q = softmax(`spliced`)."""
    log_p, log_q = logits.double().log_softmax(-1), spliced.double().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@dataclass(frozen=True)
class Spliced:
    """`spliced_metrics`' numbers, each defined in the module docstring."""
    block: int
    tokens: str
    images: int                     # images evaluated
    skipped: int                    # images that did not decode
    agreement: float                # share of images whose top-1 class the splice leaves as it was
    kl: float                       # mean KL(p_unspliced ‖ p_spliced), nats
    accuracy: float | None          # the unspliced model's, where the data's labels are the model's classes
    spliced_accuracy: float | None  # the spliced model's, on the same images

    def to_dict(self) -> dict:
        return asdict(self)


def image_batches(data: Dataset, indices: Sequence[int],
                  batch_size: int) -> Iterator[tuple[list[int], list[Image.Image], int]]:
    """The images `indices` of `data`, `batch_size` asked at a time: (their indices, the images that decoded,
    how many did not)."""
    for start in range(0, len(indices), batch_size):
        kept, images = [], []
        for i in indices[start:start + batch_size]:
            try:
                images.append(data.image(i))
            except ImageError:
                continue
            kept.append(i)
        yield kept, images, len(indices[start:start + batch_size]) - len(kept)


def spliced_metrics(loaded, data: Dataset, dictionary: Dictionary, *, block: int | None = None,
                    tokens: str | None = None, indices: Sequence[int] | None = None, batch_size: int = 64,
                    progress: bool = True) -> Spliced:
    """Agreement, KL and accuracies (the module docstring) of the loaded model with `dictionary` spliced in at
    `block` (see `site` for the defaults), over the images `indices` of `data` (default all) in batches of
    `batch_size`; images that do not decode are skipped and counted. A progress bar (stderr) counts the images."""
    indices = list(range(len(data))) if indices is None else list(indices)
    if not indices:
        raise ConceptsError("There are no images to measure the spliced model on.")
    positions = class_positions(data.classes, loaded.labels) if data.labels is not None else None
    at, images, skipped = None, 0, 0
    agree = correct = spliced_correct = 0
    kl = 0.0
    with tqdm(total=len(indices), desc=f"{loaded.name} spliced", unit="image", file=sys.stderr,
              disable=not progress, mininterval=1) as bar:
        for kept, decoded, failed in image_batches(data, indices, batch_size):
            skipped += failed
            if kept:
                with torch.inference_mode():
                    trace = loaded.model.trace(torch.cat([loaded.preprocess(image) for image in decoded]),
                                               attention=False)
                if at is None:
                    at = site(loaded, trace, dictionary, block=block, tokens=tokens)
                with torch.inference_mode():
                    x = reconstructed(trace.blocks[at.index].tokens, dictionary, at)
                    spliced = loaded.model.forward_from(at.index + 1, x, at.grid)
                predicted, spliced_predicted = trace.logits.argmax(-1), spliced.argmax(-1)
                agree += int((predicted == spliced_predicted).sum())
                kl += float(kl_divergence(trace.logits, spliced).sum())
                if positions is not None:
                    labels = torch.tensor([positions[data.labels[i]] for i in kept], device=predicted.device)
                    correct += int((predicted == labels).sum())
                    spliced_correct += int((spliced_predicted == labels).sum())
                images += len(kept)
            bar.update(len(kept) + failed)
    if not images:
        raise ConceptsError(f"None of the {len(indices)} images of {data.name} could be read.")
    labelled = positions is not None
    return Spliced(block=at.index, tokens=at.tokens, images=images, skipped=skipped, agreement=agree / images,
                   kl=kl / images, accuracy=correct / images if labelled else None,
                   spliced_accuracy=spliced_correct / images if labelled else None)


# ---- one concept taken out ----------------------------------------------------------------------------------

@torch.inference_mode()
def removed(x: Tensor, dictionary: Dictionary, at: Site, concepts: Sequence[int]) -> Tensor:
    """Block output tokens x (b n d) -> b C n d: for each of the C `concepts`, x less that concept's part
    scale · z_i W_dec[i] (`Normalisation.scale_of`) at the rows the dictionary reads (the module docstring)."""
    concepts = torch.as_tensor(concepts, dtype=torch.long, device=dictionary.W_dec.device).reshape(-1)
    if len(concepts) and not (0 <= int(concepts.min()) and int(concepts.max()) < dictionary.n_concepts):
        raise ConceptsError(f"This dictionary's concepts are 0 to {dictionary.n_concepts - 1}; "
                            f"{concepts.tolist()} are not all among them.")
    rows = x[:, at.rows]
    codes = dictionary.encode(rows)[..., concepts]                                       # b t C
    scale = dictionary.normalisation.scale_of(rows.to(codes))                            # b t 1
    parts = torch.einsum('btc,cd->bctd', codes, dictionary.W_dec[concepts]) * scale[:, None]
    out = x[:, None].repeat(1, len(concepts), 1, 1)
    out[:, :, at.rows] -= parts.to(device=x.device, dtype=x.dtype)
    return out


def without_concepts(loaded, trace: Trace, dictionary: Dictionary, *, concepts: Sequence[int],
                     block: int | None = None, tokens: str | None = None) -> Tensor:
    """b C classes: the logits of each of the trace's b images with each of the C `concepts` removed from
    `block`'s output (one at a time; the module docstring), in one forward of b·C rows."""
    at = site(loaded, trace, dictionary, block=block, tokens=tokens)
    with torch.inference_mode():
        x = removed(trace.blocks[at.index].tokens, dictionary, at, concepts)
        logits = loaded.model.forward_from(at.index + 1, x.flatten(0, 1), at.grid)
    return logits.reshape(x.shape[0], x.shape[1], -1)


@dataclass(frozen=True)
class ConceptEffects:
    """What removing each of C concepts from one photo's block output does to the target class (the unchanged
    numbers come from the same forward as the changed ones, so a concept that does not fire changes nothing)."""
    concepts: Tensor        # C long
    target: int
    logit: float            # the target's logit, nothing removed
    probability: float      # its probability, nothing removed
    logits: Tensor          # C: the target's logit with each concept removed
    probabilities: Tensor   # C: its probability with each concept removed
    predictions: Tensor     # C long: the top class with each concept removed

    @property
    def logit_change(self) -> Tensor:
        return self.logits - self.logit

    @property
    def probability_change(self) -> Tensor:
        return self.probabilities - self.probability


def concept_effects(loaded, trace: Trace, dictionary: Dictionary, *, concepts: Sequence[int],
                    target: Target = None, block: int | None = None, tokens: str | None = None) -> ConceptEffects:
    """How the target class (default the photo's top prediction) of the one photo of `trace` changes when each
    of `concepts` (the photo's most active, say) is removed from `block`'s output: one forward of C + 1 rows,
    the first with nothing removed."""
    if trace.logits.shape[0] != 1:
        raise ConceptsError(f"concept_effects explains one photo; this trace holds {trace.logits.shape[0]}.")
    at = site(loaded, trace, dictionary, block=block, tokens=tokens)
    x = trace.blocks[at.index].tokens
    with torch.inference_mode():
        rows = torch.cat([x, removed(x, dictionary, at, concepts)[0]])
        logits = loaded.model.forward_from(at.index + 1, rows, at.grid).float()
    target = int(resolve_target(logits[:1], target)[0])
    probabilities = logits.softmax(-1)[:, target]
    return ConceptEffects(concepts=torch.as_tensor(concepts, dtype=torch.long).reshape(-1).cpu(), target=target,
                          logit=float(logits[0, target]), probability=float(probabilities[0]),
                          logits=logits[1:, target].cpu(), probabilities=probabilities[1:].cpu(),
                          predictions=logits[1:].argmax(-1).cpu())
