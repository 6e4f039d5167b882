"""What the atlas knows of one dictionary, gathered from the files beside it: nothing here computes a model.

    facts = gather("across-cifar10")
    facts.models                    # ('vit-cifar10', 'cvt-cifar10', 'swin-cifar10', 'resnet-cifar10')
    facts.indexes["vit-cifar10"]    # its exemplar index (`concepts.analysis.exemplars`), where there is one
    facts.problems                  # what is missing, each a sentence saying what to run first
    facts.title(613)                # '#613 cat 40 %, dog 40 %', the name where the concept fires most often

The sources, each optional (a missing one leaves its part of the pages out, said in words):

- the exemplar index of each model (`exemplars.index_in`): each concept's top images, its maps and how often it
  fires; the concepts' names come from it (`names.concept_names`);
- the pictures (`looks.pictures_of`): the shared picture and each model's own;
- `metrics.json`: FVU or the R² matrix, dead shares, and for a dictionary across models the shared concepts and
  each model's own (`concepts evaluate`);
- match files (`concepts match`: `matches.json` in a folder beside the dictionary's): a concept's partner in the
  other dictionary, and the correlation of their codes;
- class circuits (`circuits --data --class`): the circuit's concept nodes at the block this dictionary sits at,
  with their effects on the class's logit.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .. import catalog
from ..concepts import Across, ConceptsError, load as load_dictionary
from ..concepts.analysis.exemplars import Exemplars, index_in
from ..concepts.analysis.match import MATCHES_FILE
from ..concepts.analysis.names import ConceptName, concept_names
from ..concepts.files import folder_of
from ..concepts.files.own import checksum
from ..files import safe_name
from ..looks import LooksError, Pictures, pictures_of


@dataclass(frozen=True)
class Partner:
    """A concept's match in another dictionary: which dictionary (by its model and block), the concept, ρ."""
    model: str
    block: int
    concept: int
    correlation: float


@dataclass(frozen=True)
class CircuitNode:
    """A concept of this dictionary in a class circuit: the model and class, its effect on the class's logit
    minus the mean logit (averaged over the class's images), and the circuit's file."""
    model: str
    label: str
    concept: int
    effect: float
    file: str


@dataclass
class Facts:
    """One dictionary's facts for the atlas (module docstring)."""
    source: str
    slug: str                                   # its folder in the site
    dictionary: object                          # Dictionary or Across
    models: tuple[str, ...]
    n_concepts: int
    sha256: str                                 # the dictionary's weights (`files.own.checksum`)
    indexes: dict[str, Exemplars] = field(default_factory=dict)
    names: dict[str, list[ConceptName]] = field(default_factory=dict)
    pictures: Pictures | None = None
    metrics: dict = field(default_factory=dict)
    partners: dict[int, list[Partner]] = field(default_factory=dict)
    circuits: list[CircuitNode] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def across(self) -> bool:
        return isinstance(self.dictionary, Across)

    @property
    def block(self) -> int | None:
        """The block the dictionary reads (a dictionary across models: each model's own; the first's here)."""
        first = self.dictionary.per_model[0] if self.across else self.dictionary
        return first.block

    def frequency(self, concept: int) -> dict[str, float]:
        """model -> the share of its grid tokens the concept fires on, for the models with an index."""
        return {model: float(index.frequency[concept]) for model, index in self.indexes.items()}

    def name(self, concept: int) -> ConceptName:
        """The concept's name from the index of the model it fires in most often (unnamed without an index)."""
        frequency = self.frequency(concept)
        if not frequency:
            return ConceptName(concept)
        return self.names[max(frequency, key=frequency.get)][concept]

    def title(self, concept: int) -> str:
        return self.name(concept).title

    def kind_of(self, concept: int) -> str | None:
        """'shared' or 'own to MODEL' for a dictionary across models whose metrics say so; None otherwise."""
        if concept in set(self.metrics.get("shared_concepts", ())):
            return "shared by every model"
        for model, own in self.metrics.get("specific_concepts", {}).items():
            if concept in set(own):
                return f"{model}'s own"
        return "neither shared by all nor one model's own" if "shared_concepts" in self.metrics else None

    def kind_words(self, concept: int) -> str:
        """What the search finds the concept's kind by: 'shared', 'own MODEL', or nothing."""
        if concept in set(self.metrics.get("shared_concepts", ())):
            return "shared"
        return next((f"own {model}" for model, own in self.metrics.get("specific_concepts", {}).items()
                     if concept in set(own)), "")

    def circuit_nodes(self, concept: int) -> list[CircuitNode]:
        return [node for node in self.circuits if node.concept == concept]


def slug_of(source: str) -> str:
    """The folder a dictionary's pages go in: its bundled name, or its folder's name, safe as a path component."""
    return safe_name(Path(str(source)).name if str(source) not in catalog.BUNDLED_DICTIONARIES else str(source))


def gather(source: str, *, circuits: Iterable[Path] = (), matches: Iterable[Path] = ()) -> Facts:
    """The facts of the dictionary `source` (a bundled name or a folder) from its folder, the class circuit files
    `circuits` and the match folders `matches` (those naming other dictionaries are passed over)."""
    dictionary = load_dictionary(source)
    across = isinstance(dictionary, Across)
    models = tuple(dictionary.models) if across else (dictionary.model or "the model",)
    state = {name: value.detach().cpu() for name, value in dictionary.state_dict().items()}
    facts = Facts(source=str(source), slug=slug_of(source), dictionary=dictionary, models=models,
                  n_concepts=dictionary.n_concepts, sha256=checksum(state))
    folder = folder_of(source)
    for model in models:
        try:
            index = index_in(source, dictionary=dictionary.dictionary(model) if across else dictionary)
        except ConceptsError as e:
            facts.problems.append(f"No top images of {model}: {e}")
            continue
        facts.indexes[model] = index
        facts.names[model] = concept_names(index)
    try:
        facts.pictures = pictures_of(source)
    except LooksError as e:
        facts.problems.append(f"No pictures: {e}")
    if facts.pictures is None and not any("pictures" in p for p in facts.problems):
        facts.problems.append(f"No pictures of its concepts: `python -m vitviz looks --pictures --concepts "
                              f"{source}` draws them.")
    elif facts.pictures is not None and facts.across and facts.pictures.tables is None:
        facts.problems.append(f"No table of whether the models see each concept alike: `python -m vitviz looks "
                              f"--concepts {source} --alike` measures it from the pictures.")
    metrics = None if folder is None else folder / "metrics.json"
    if metrics is not None and metrics.is_file():
        facts.metrics = json.loads(metrics.read_text())
    if not across:
        facts.partners = partners(dictionary, matches)
    facts.circuits = circuit_nodes(facts.slug, circuits)
    return facts


def partners(dictionary, folders: Iterable[Path]) -> dict[int, list[Partner]]:
    """concept -> its matches in the match files of `folders` one of whose sides is this dictionary (its model,
    block and number of concepts)."""
    found: dict[int, list[Partner]] = {}
    for folder in folders:
        try:
            saved = json.loads((Path(folder) / MATCHES_FILE).read_text())
            sides = saved["sides"]
            mine = [s for s, side in enumerate(sides) if side["model"] == dictionary.model
                    and side["block"] == dictionary.block
                    and side["dictionary"]["n_concepts"] == dictionary.n_concepts]
            for s in mine:
                other = sides[1 - s]
                for pair in saved["pairs"]:
                    found.setdefault(int(pair[s]), []).append(
                        Partner(model=str(other["model"]), block=int(other["block"]), concept=int(pair[1 - s]),
                                correlation=float(pair[2])))
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue   # not a match file, or not one of this dictionary's: passed over
    return found


def circuit_nodes(slug: str, files: Iterable[Path]) -> list[CircuitNode]:
    """Every concept node of the class circuits in `files` at a site whose dictionary is `slug` (by name)."""
    nodes = []
    for path in files:
        try:
            circuit = json.loads(Path(path).read_text())
            blocks = {site["block"] for site in circuit["sites"] if slug_of(site["dictionary"]) == slug}
            for node in circuit["nodes"]:
                if node.get("kind") == "concept" and node.get("block") in blocks:
                    nodes.append(CircuitNode(model=str(circuit["model"]), label=str(circuit["target_label"]),
                                             concept=int(node["concept"]), effect=float(node["effect"]),
                                             file=Path(path).name))
        except (OSError, ValueError, KeyError, TypeError):
            continue   # not a class circuit: passed over
    return nodes


def match_folders(sources: Iterable[str]) -> list[Path]:
    """The folders holding a match file beside the dictionaries `sources` (and the bundled ones)."""
    parents = {catalog.CHECKPOINTS / "concepts"}
    for source in sources:
        folder = folder_of(source)
        if folder is not None:
            parents.add(folder.parent)
    return sorted({path.parent for parent in parents if parent.is_dir() for path in parent.glob(f"*/{MATCHES_FILE}")})
