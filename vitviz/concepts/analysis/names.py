"""A name for every concept: the classes of the images it fires on most, with their shares; and, for a dictionary
of a CLIP image tower, the words of a stated list nearest to it in CLIP's joint space.

    names = concept_names(index_in("vit-cifar10-last"))   # one `ConceptName` per concept of the exemplar index
    names[165].title    # '#165 automobile 60 %, airplane 40 %'   ('concept 165' where it has no name)
    names[165].words    # 'automobile 60 %, airplane 40 %'        ('' then)
    concept_names(index, [3, 17])                          # concepts 3 and 17 alone
    concept_names(None, [3, 17])                           # no index: 'concept 3', 'concept 17'
    dictionary_names("vit-cifar10-last", dictionary)      # from the index beside a dictionary (or its folder)
    nearest_words(dictionary, clip_model)                  # per concept its nearest words of `word_list()`

By classes. Concept c's exemplars are its top images in a data set (`exemplars.py`: the images whose largest code
of c is largest, `top` of them, fewer where c fires on fewer). With m_c of them and m_ck of class k, the share of k

    share_ck = m_ck / m_c

counted over all its exemplars (one without a class among them), so a concept's shares add up to at most 1. Its
name lists the classes whose share is at least `MIN_SHARE`, largest first, at most `MOST_CLASSES` of them, the
percentages rounded down, so that those listed never add up past 100 %. A quarter is two of the five exemplars the
bundled indexes keep, or of the eight `concepts exemplars` keeps by default: one image alone names nothing. Equal
shares are ordered by the sum of their exemplars' values (the class the concept fires on more strongly first), then
by the data set's order of classes. A concept with classes among its exemplars but none with that share is 'mixed
classes'; one with no exemplar, or of an index without classes (a data set without labels), or of no index at all,
is unnamed and called by its number ('concept 394'). The index keeps each exemplar's class, so the names need no
data set.

By words. CLIP-Dissect (Oikarinen & Weng 2023) names a neuron by the word of a list whose CLIP image-text
similarity over a probe set of images goes most with the neuron's activations over them (its simplest similarity
the cosine of the two profiles). A concept of a dictionary on CLIP's image tower is a direction of the tokens, which
CLIP's own head carries into the joint space, so here the direction itself is compared with each word's text
features, with no probe set:

    e_c = W_proj (γ ⊙ (w_c - mean(w_c)))     w_c = W_dec[c], concept c's direction in the block's tokens (d)
    t_j = text_features(word_j)               CLIP's text tower on the word alone, as CLIP-Dissect encodes its list
    sim_cj = cos(e_c, t_j)

with γ the gain of the image tower's final LayerNorm (ln_post) and W_proj its projection into the joint space. e_c is
the change a step along w_c makes to the image features with the norm's statistics of the token held (the centring
and gain of the LayerNorm; its division by the token's spread, a positive number, leaves the cosine as it is): the
direct path, as the logit lens and LeGrad-CLIP read any block's tokens through ln_post and the projection. For the
last block that is where the concept moves the image features; for an earlier one, what its direction would say
read at the end, the blocks after it skipped.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from ...hub.loaded import LoadError
from ..kinds.dictionary import ConceptsError, Dictionary
from .exemplars import Exemplars, index_in

if TYPE_CHECKING:
    from ...hub import LoadedModel

MIN_SHARE = 0.25     # a class is named where at least this share of the concept's exemplars is of it
MOST_CLASSES = 2     # and at most this many classes are named
MIXED = "mixed classes"
WORDS = Path(__file__).with_name("words.txt")   # the word list `nearest_words` compares with, one word a line
NEAREST = 3          # words given per concept
TEXT_BATCH = 128     # words through CLIP's text tower at once


@dataclass(frozen=True)
class ConceptName:
    """Concept `concept`'s name from its `exemplars` top images: the classes named with how many of those images
    are of each (`classes`, largest first; none where it is unnamed or mixed), and how many of them have a class."""
    concept: int
    classes: tuple[tuple[str, int], ...] = ()
    exemplars: int = 0
    labelled: int = 0

    @property
    def shares(self) -> tuple[tuple[str, float], ...]:
        """The classes named with their shares of the exemplars."""
        return tuple((name, count / self.exemplars) for name, count in self.classes)

    @property
    def words(self) -> str:
        """'airplane 60 %, ship 40 %' (the percentages rounded down); 'mixed classes' where no class has
        `MIN_SHARE` of the exemplars; '' where it is unnamed."""
        if self.classes:
            return ", ".join(f"{name} {100 * count // self.exemplars} %" for name, count in self.classes)
        return MIXED if self.labelled else ""

    @property
    def title(self) -> str:
        """The number beside the name, '#165 automobile 60 %, airplane 40 %', or the number alone, 'concept 165'."""
        return f"#{self.concept} {self.words}" if self.words else f"concept {self.concept}"

    def __str__(self) -> str:
        return self.title


def class_counts(exemplars: Exemplars) -> tuple[Tensor, Tensor, Tensor]:
    """Per concept, how many of its exemplars are of each class (n k int64), the sum of their values (n k
    float64), and how many exemplars it has (n int64); k = 0 for an index without classes."""
    fires = exemplars.images >= 0                                          # n top
    n, k = exemplars.n_concepts, len(exemplars.classes or ())
    labels = torch.full_like(exemplars.images, -1)
    if len(exemplars.thumbnail_images):
        where = torch.searchsorted(exemplars.thumbnail_images, exemplars.images.clamp(min=0))
        labels = torch.where(fires, exemplars.labels[where.clamp(max=len(exemplars.labels) - 1)], -1)
    slot = labels + 1   # 0: no class, or an empty place
    counts = torch.zeros(n, k + 1, dtype=torch.int64).scatter_add_(1, slot, fires.long())
    strength = torch.zeros(n, k + 1, dtype=torch.float64).scatter_add_(1, slot, exemplars.values.double() * fires)
    return counts[:, 1:], strength[:, 1:], fires.sum(1)


def concept_names(exemplars: Exemplars | None, concepts: Iterable[int] | None = None) -> list[ConceptName]:
    """The names of `concepts` (all of the index's by default) from the classes of their exemplars in `exemplars`
    (module docstring); without an index, `concepts` unnamed."""
    if exemplars is None:
        if concepts is None:
            raise ConceptsError("Without an exemplar index the concepts have no names but their numbers: say which "
                                "concepts to name.")
        return [ConceptName(int(c)) for c in concepts]
    n = exemplars.n_concepts
    concepts = range(n) if concepts is None else [int(c) for c in concepts]
    wrong = [c for c in concepts if not 0 <= c < n]
    if wrong:
        raise ConceptsError(f"This exemplar index has concepts 0 to {n - 1}; there is no {wrong[0]}.")
    counts, strength, sizes = (t.tolist() for t in class_counts(exemplars))
    classes = exemplars.classes or ()
    names = []
    for c in concepts:
        order = sorted(range(len(classes)), key=lambda j: (-counts[c][j], -strength[c][j], j))
        named = tuple((classes[j], counts[c][j]) for j in order[:MOST_CLASSES]
                      if counts[c][j] > 0 and counts[c][j] >= MIN_SHARE * sizes[c])
        names.append(ConceptName(c, named, exemplars=sizes[c], labelled=sum(counts[c])))
    return names


def dictionary_names(source: str | Path, dictionary: Dictionary,
                     concepts: Iterable[int] | None = None) -> list[ConceptName]:
    """The names of `dictionary`'s `concepts` (all by default) from the exemplar index beside it in `source` (a
    bundled dictionary's name, or its folder: `exemplars.index_in`, the index built from these weights); their
    numbers alone where there is none."""
    try:
        index = index_in(source, dictionary=dictionary)
    except ConceptsError:   # none beside it, or none of these weights: called by their numbers
        index = None
    return concept_names(index, range(dictionary.n_concepts) if concepts is None else concepts)


# ---- by words: CLIP ---------------------------------------------------------------------------------------

def word_list(path: str | Path = WORDS) -> tuple[str, ...]:
    """The words of a plain-text list, one a line (blank lines and lines starting with '#' left out, repeats
    once): by default vitviz's own, a few hundred common visual words."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConceptsError(f"The word list {path} cannot be read ({e}).") from None
    words = tuple(dict.fromkeys(w for w in (line.strip() for line in lines) if w and not w.startswith("#")))
    if not words:
        raise ConceptsError(f"The word list {path} holds no word: write one a line.")
    return words


def joint_directions(dictionary: Dictionary, clip_model: LoadedModel) -> Tensor:
    """Each concept's direction carried into CLIP's joint space, e_c = W_proj (γ ⊙ (w_c - mean(w_c))) (module
    docstring): n embed_dim, unnormalised. Refused in words unless `clip_model` is a CLIP model (both towers
    loaded) and the dictionary one of its image tower's."""
    clip = clip_model.clip
    if not clip_model.takes_prompts or clip is None:
        raise ConceptsError(f"{clip_model.name} is not a CLIP model: concepts are named by words only for a "
                            f"dictionary of a CLIP image tower, whose joint space the words' text features share.")
    if not isinstance(dictionary, Dictionary):
        raise ConceptsError("Name the concepts of one model's dictionary by words: for a dictionary across models, "
                            "pass the CLIP model's own (`Across.dictionary(model)`).")
    if dictionary.model is not None and dictionary.model != clip_model.name:
        raise ConceptsError(f"This dictionary was trained on {dictionary.model}, not on {clip_model.name}: name its "
                            f"concepts with its own model.")
    visual = clip.visual
    final = visual.fc_norm if visual.config.use_fc_norm else visual.norm   # what the projection reads
    if dictionary.d != visual.config.embed_dim:
        raise ConceptsError(f"This dictionary's directions have {dictionary.d} entries; {clip_model.name}'s image "
                            f"tower's tokens have {visual.config.embed_dim}: it is not one of its blocks'.")
    with torch.inference_mode():
        w = dictionary.W_dec.detach().to(device=clip_model.device, dtype=torch.float32)   # n d
        return clip.visual_proj((w - w.mean(1, keepdim=True)) * final.weight)


def nearest_words(dictionary: Dictionary, clip_model: LoadedModel, *, words: Sequence[str] | None = None,
                  concepts: Iterable[int] | None = None,
                  top: int = NEAREST) -> list[tuple[tuple[str, float], ...]]:
    """Per concept of `concepts` (all by default), the `top` words of `words` (`word_list()` by default) nearest
    to it, with their cosines sim_cj = cos(e_c, t_j) (module docstring: the concept's direction through CLIP's
    final norm and projection against the word's text features), nearest first."""
    if not isinstance(top, int) or top < 1:
        raise ConceptsError(f"top must be a whole number of at least 1, not {top!r}.")
    words = word_list() if words is None else tuple(words)
    if not words:
        raise ConceptsError("Give at least one word to name the concepts by.")
    directions = joint_directions(dictionary, clip_model)
    n = len(directions)
    concepts = list(range(n)) if concepts is None else [int(c) for c in concepts]
    wrong = [c for c in concepts if not 0 <= c < n]
    if wrong:
        raise ConceptsError(f"This dictionary has concepts 0 to {n - 1}; there is no {wrong[0]}.")
    try:
        with torch.inference_mode():
            text = torch.cat([clip_model.text_features(list(words[i:i + TEXT_BATCH]))
                              for i in range(0, len(words), TEXT_BATCH)])
    except LoadError as e:   # no word, an empty one
        raise ConceptsError(f"The words cannot be read by {clip_model.name}'s text tower: {e}") from None
    similarity = F.normalize(directions[concepts], dim=-1) @ F.normalize(text, dim=-1).T   # concepts words
    values, nearest = similarity.float().cpu().topk(min(top, len(words)), dim=1)
    return [tuple((words[j], v) for j, v in zip(row, value)) for row, value in zip(nearest.tolist(), values.tolist())]
