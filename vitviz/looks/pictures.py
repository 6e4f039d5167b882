"""Every concept's picture, drawn once and shipped beside its dictionary: what the concept cards show.

    pictures = make_pictures("checkpoints/concepts/vit-cifar10-last")    # every concept, `SETTINGS`
    save_pictures(pictures, "checkpoints/concepts/vit-cifar10-last")      # looks.safetensors in the folder
    pictures = pictures_of("vit-cifar10-last")       # the app's loader: a bundled name or a folder; None if none
    image, alpha = pictures.picture(394)             # uint8 h w 3 and h w; across: .picture(394, "cvt-cifar10")

A dictionary of one model has one set of pictures, named by its model. A dictionary across models has a set
'shared' (each concept maximised in all its models at once, `draw.draw` over them) and one per model (the concept
maximised in that model alone), so a card can show whether the models see it alike.

The settings (`SETTINGS`) are MACO's on a canvas of the model's input (32 px for the bundled models) with crops of
80 to 100 % of it, 2 copies a step and 32 steps, seed 0: on the bundled ViT's first 8 concepts the objective reaches
about four fifths of where 128 steps of 4 copies take it, in pictures alike (docs/looks.md), at a sixteenth of the
cost. Concepts are drawn `BATCH` at a time on the CPU (float32); each picture's randomness is its own
(`images.Randomness`), so `make_pictures` again, or `draw` of a few of them, makes the same pictures.

The file, `looks.safetensors` (`FILE`), one safetensors file:

    tensors  <set>.jpeg (uint8: each concept's picture, then its transparency map, as JPEG, concatenated),
             <set>.offsets (2n+1 int64: picture i is jpeg[o[2i]:o[2i+1]], its map jpeg[o[2i+1]:o[2i+2]]),
             <set>.curve (n steps float32: each picture's objective before each step)
             alike.values, alike.percentiles (a dictionary across models, where measured: `alike.Tables`, n S M and
             n M float32; NaN where a model's percentile is not above 0)
    __metadata__ {"vitviz_looks": JSON}: format "vitviz-looks", version, sets, n_concepts, settings (method and its
             settings, steps, copies, seed, canvas), dictionary_sha256 (as `concepts.files.own.checksum`), seconds
             (the drawing's wall time), drawing (`draw.DRAWING`, the revision of the drawing that made them),
             alike (where measured: the tables' sets, models, data and percentile)

Version 2 added `drawing`; a version 1 file is read as drawing 1 (the standardised phase alone and seeds by concept
number: a dark corner in every picture, docs/looks.md), and `Pictures.current` says whether a file's pictures are
what this vitviz draws.
"""
from __future__ import annotations

import io
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save as save_tensors
from torch import Tensor

from ..concepts import Across, ConceptsError, load as load_dictionary
from ..concepts.files import folder_of
from ..concepts.files.own import checksum, read_checked
from ..files import write_atomic
from .alike import PERCENTILE, SHARED, Alike, Tables
from .draw import DRAWING, Progress, Settings, draw, transparent
from .images import Maco
from .targets import Concept, LooksError

FORMAT, VERSION = "vitviz-looks", 2
FILE = "looks.safetensors"
HEADER_KEY = "vitviz_looks"
SETTINGS = Settings(method=Maco(canvas=1.0, box=(0.8, 1.0)), steps=32, copies=2, seed=0)
BATCH = 64                     # concepts drawn at once
JPEG_QUALITY = 90              # 4:4:4 (no chroma subsampling): a 32 px picture in about 0.9 KB
MAP_QUALITY = 75               # the transparency map (grey, shown through a high percentile's clip): 0.4 KB


@dataclass(frozen=True)
class Pictures:
    """A dictionary's pictures: per set (a model's name, or 'shared'), the JPEG bytes and offsets and the curves."""
    sets: dict[str, tuple[Tensor, Tensor, Tensor]]   # set -> (jpeg uint8, offsets 2n+1 int64, curve n steps)
    n_concepts: int
    settings: dict
    dictionary_sha256: str
    seconds: float
    drawing: int = DRAWING   # the drawing's revision that made them (`draw.DRAWING`)
    tables: Tables | None = None   # a dictionary across models': how each picture excites the concept in each model

    @property
    def current(self) -> bool:
        """Whether these pictures were made by this vitviz's drawing (older ones were drawn before a fix)."""
        return self.drawing == DRAWING

    @property
    def models(self) -> tuple[str, ...]:
        """The models with pictures of their own."""
        return tuple(name for name in self.sets if name != SHARED)

    def picture(self, concept: int, model: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(the picture, h w 3 uint8; its transparency map, h w uint8) of `concept`: the shared one of a dictionary
        across models unless `model` names one of its models, the model's own of a dictionary of one."""
        name = model or (SHARED if SHARED in self.sets else self.models[0])
        if name not in self.sets:
            raise LooksError(f"These pictures are of {', '.join(self.sets)}; there are none of {name}.")
        if not isinstance(concept, int) or not 0 <= concept < self.n_concepts:
            raise LooksError(f"There are {self.n_concepts} concepts (0 to {self.n_concepts - 1}); no concept "
                             f"{concept!r}.")
        jpeg, offsets, _ = self.sets[name]
        a, b, c = (int(v) for v in offsets[2 * concept:2 * concept + 3])
        decode = lambda part: np.asarray(Image.open(io.BytesIO(part.numpy().tobytes())))
        return decode(jpeg[a:b]), decode(jpeg[b:c])

    def alike(self, concept: int, dictionary: str = "") -> Alike | None:
        """Concept `concept`'s table of how each model's picture (and the shared one) excites it in every model, or
        None where none was measured (`vitviz looks --concepts ACROSS --alike`)."""
        return None if self.tables is None else self.tables.of(dictionary, concept)

    def transparent(self, concept: int, model: str | None = None) -> np.ndarray:
        """The picture with its transparency map applied (`draw.transparent`): h w 4 uint8 RGBA."""
        return transparent(*self.picture(concept, model))

    def curve(self, concept: int, model: str | None = None) -> np.ndarray:
        """The picture's objective before each step (float32)."""
        name = model or (SHARED if SHARED in self.sets else self.models[0])
        return self.sets[name][2][concept].numpy()


def jpegs(images: np.ndarray, alpha: np.ndarray) -> list[bytes]:
    """Each picture (B S S 3) and then its map (B S S), floats in [0, 1], as the file's JPEG bytes."""
    out = []
    for image, mask in zip(images, alpha):
        for pixels, quality in (((image * 255).round().astype(np.uint8), JPEG_QUALITY),
                                ((mask * 255).round().astype(np.uint8), MAP_QUALITY)):
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality, subsampling=0)
            out.append(buffer.getvalue())
    return out


def make_pictures(source: str | Path, *, settings: Settings = SETTINGS, batch: int = BATCH,
                  limit: int | None = None, device: str | torch.device = "cpu",
                  progress: Progress | None = None, bar: bool = True) -> Pictures:
    """Every concept's picture (the first `limit` alone, where given) of the dictionary `source` (a bundled name or a
    folder), in
    batches of `batch`; for a dictionary across models the shared pictures and each model's own. `progress(done,
    all)` counts pictures."""
    dictionary = load_dictionary(source)
    across = isinstance(dictionary, Across)
    models = dictionary.models if across else (dictionary.model,)
    if not all(models):
        raise LooksError(f"The dictionary {source} does not record its model, so it cannot be drawn.")
    concepts = range(dictionary.n_concepts if limit is None else min(limit, dictionary.n_concepts))
    plan = ([(SHARED, list(models))] if across else []) + [(m, [m]) for m in models]
    from .. import hub

    loaded = {m: hub.load(m, device=device) for m in models}
    total, done, start = len(plan) * len(concepts), 0, time.perf_counter()
    sets = {}
    for name, drawn_in in plan:
        encoded, curves = [], []
        for first in range(0, len(concepts), batch):
            ids = concepts[first:first + batch]
            drawing = draw([loaded[m] for m in drawn_in], [Concept(source, c) for c in ids], settings=settings,
                           device=device, bar=bar)
            encoded += jpegs(drawing.images, drawing.alpha)
            curves.append(torch.from_numpy(drawing.curve))
            done += len(ids)
            if progress is not None:
                progress(done, total)
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum([len(j) for j in encoded])]).astype(np.int64))
        sets[name] = (torch.frombuffer(bytearray(b"".join(encoded)), dtype=torch.uint8), offsets, torch.cat(curves))
    state = {k: v.detach().cpu() for k, v in dictionary.state_dict().items()}
    return Pictures(sets=sets, n_concepts=len(concepts), settings=settings_record(settings),
                    dictionary_sha256=checksum(state), seconds=time.perf_counter() - start)


def settings_record(settings: Settings) -> dict:
    """What the file records of the settings: the method's name and its own settings, steps, copies, seed, canvas."""
    return {"method": settings.method.name, **{k: v for k, v in asdict(settings).items() if k != "method"},
            "method_settings": asdict(settings.method)}


def save_pictures(pictures: Pictures, folder: str | Path) -> Path:
    """`pictures` written into the dictionary's `folder` as looks.safetensors, atomically; -> the file."""
    tensors = {}
    for name, (jpeg, offsets, curve) in pictures.sets.items():
        tensors |= {f"{name}.jpeg": jpeg, f"{name}.offsets": offsets, f"{name}.curve": curve.float().contiguous()}
    tables = pictures.tables
    if tables is not None:
        tensors |= {"alike.values": torch.from_numpy(tables.values).float(),
                    "alike.percentiles": torch.from_numpy(tables.percentiles).float()}
    header = {"format": FORMAT, "version": VERSION, "sets": list(pictures.sets), "n_concepts": pictures.n_concepts,
              "settings": pictures.settings, "dictionary_sha256": pictures.dictionary_sha256,
              "seconds": round(pictures.seconds, 1), "drawing": pictures.drawing, "sha256": checksum(tensors)}
    if tables is not None:
        header["alike"] = {"sets": list(tables.sets), "models": list(tables.models), "data": tables.data,
                           "percentile": PERCENTILE}
    path = Path(folder) / FILE
    write_atomic(path, save_tensors(tensors, {HEADER_KEY: json.dumps(header)}))
    return path


def pictures_of(source: str | Path) -> Pictures | None:
    """The pictures beside a dictionary (a bundled dictionary's name, or its folder), or None where it has none;
    a damaged file is refused in words (`LooksError`)."""
    folder = folder_of(source)
    path = None if folder is None else folder / FILE
    if path is None or not path.is_file():
        return None
    try:
        tensors, header = read_checked(path, key=HEADER_KEY, format=FORMAT, version=VERSION, what="pictures file",
                                       again="draw the pictures again (checkpoints/concepts/looks.sh)")
    except ConceptsError as e:
        raise LooksError(str(e)) from None
    n = int(header["n_concepts"])
    sets = {}
    for name in header["sets"]:
        jpeg, offsets, curve = (tensors[f"{name}.{part}"] for part in ("jpeg", "offsets", "curve"))
        if len(offsets) != 2 * n + 1 or int(offsets[-1]) != len(jpeg) or len(curve) != n:
            raise LooksError(f"{path} is not sound: its {name} pictures do not hold {n} concepts; draw them again.")
        sets[name] = (jpeg, offsets, curve)
    tables = None
    if "alike" in header:
        record = header["alike"]
        values, percentiles = tensors.get("alike.values"), tensors.get("alike.percentiles")
        shape = (n, len(record["sets"]), len(record["models"]))
        if values is None or percentiles is None or tuple(values.shape) != shape or \
                tuple(percentiles.shape) != (n, shape[2]):
            raise LooksError(f"{path} is not sound: its table of how the models see each concept is not of {n} "
                             f"concepts' pictures; measure it again (vitviz looks --concepts ... --alike).")
        tables = Tables(sets=tuple(record["sets"]), models=tuple(record["models"]), values=values.double().numpy(),
                        percentiles=percentiles.double().numpy(), data=record["data"])
    return Pictures(sets=sets, n_concepts=n, settings=header["settings"],
                    dictionary_sha256=header["dictionary_sha256"], seconds=float(header["seconds"]),
                    drawing=int(header.get("drawing", 1)),   # version 1 files: drawn before `drawing` was recorded
                    tables=tables)
