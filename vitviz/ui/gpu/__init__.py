"""The boundary to the models: the only functions of the app that run a model, and the only ones
`spaces.GPU` decorates.

On a ZeroGPU Space each call runs in a forked worker process that holds a GPU: its arguments and its
result cross by pickle, and whatever it writes into module state stays in the worker. So every
function here takes plain arguments (model names, pixels, map requests) and *returns* what it
computed as detached fp32 CPU tensors or arrays, stacked per model; the app's process keeps them
(`store.py`). Models cross by name, never as objects: each process loads what it asks for into its
own cache (`hub.load`), and the page's default pair is placed on the device at start (`place`), which
is what ZeroGPU moves to each worker's GPU. A message a person must read is raised as `gr.Error`:
ZeroGPU relays only its words (any other exception reaches the page as its class name).

Elsewhere (a CPU machine, a GPU Space) `spaces.GPU` changes nothing and these are plain calls.

One module a job: `boundary.py` the decorator, loading and the trace every tab draws from; then each feature's
GPU work in its own, `maps.py` (the first screen's maps and curves, the video's frames), `layers.py` (the Compare
tab), `decisions.py` (What decides), `dictionaries.py` (Concepts), `circuits.py` (Circuits), `looks.py` (the feature
pictures: the concept cards' "Draw this concept", the Anatomy tab's unit, `/looks`), `training.py` (a photo along
training). A new tab's GPU work
is a new module here, its functions decorated with `boundary.gpu` and listed below, where the tabs call them as
`gpu.<name>`.
"""
from .boundary import (
    DEVICE,
    LOCAL_ALLOWED,
    STARTING,
    TRACE_LOADING_S,
    TRACE_S,
    ZERO_GPU,
    Traced,
    in_words,
    load_model,
    place,
    trace,
    trace_seconds,
)
from .circuits import CircuitReading, read_cell_circuits, read_circuits
from .decisions import PATCH_BATCH, decide, patch
from .dictionaries import (
    ConceptImage,
    ConceptReading,
    Concepts,
    Removal,
    concepts,
    dictionary_folder,
    dictionary_source,
)
from .layers import Lens, cka, lens, receptive
from .looks import TARGET_KINDS, Picture, draw_pictures, drawing_seconds, duration_words, whole_number
from .maps import FAITHFULNESS_S, MAPS_S, cards, class_maps, faithfulness, video_frames
from .training import over_training

__all__ = ["DEVICE", "FAITHFULNESS_S", "LOCAL_ALLOWED", "MAPS_S", "PATCH_BATCH", "STARTING", "TARGET_KINDS",
           "TRACE_LOADING_S", "TRACE_S", "ZERO_GPU", "CircuitReading", "ConceptImage", "ConceptReading", "Concepts",
           "Lens", "Picture", "Removal", "Traced", "cards", "cka", "class_maps", "concepts", "decide",
           "dictionary_folder", "dictionary_source", "draw_pictures", "drawing_seconds", "duration_words",
           "faithfulness", "in_words", "lens", "load_model", "over_training", "patch", "place", "read_cell_circuits",
           "read_circuits", "receptive", "trace", "trace_seconds", "video_frames", "whole_number"]
