"""What a concept, unit, channel or class looks like: feature visualisation, for every family vitviz loads.

    from vitviz import looks
    drawing = looks.draw("vit-cifar10", [looks.Concept("vit-cifar10-last", 394)])     # MACO, 64 steps
    drawing.images[0], drawing.alpha[0], drawing.curve[0]    # S S 3 in [0, 1], its transparency map, the objective
    looks.draw("vit-cifar10", looks.Unit(block=3, unit=17), settings=looks.Settings(method="pixels"))
    looks.draw(["vit-cifar10", "cvt-cifar10", "swin-cifar10", "resnet-cifar10"],   # one picture, four models
               [looks.Concept("across-cifar10", c) for c in (5, 9)])
    pictures = looks.pictures_of("vit-cifar10-last")      # every concept's, drawn once and shipped
    image, alpha = pictures.picture(394)
    looks.transparent(image, alpha)                       # h w 4 RGBA: the map applied, as the paper shows pictures
    looks.draw("vit-cifar10", looks.Concept("vit-cifar10-last", 17), variants=3)   # three pictures, pushed apart
    looks.draw("vit-cifar10", looks.Concept("vit-cifar10-last", 17, position=9), negative=True)   # lowers it most
    print(looks.alike("across-cifar10", 5).words())       # each model's picture in the others, x their 99th percentile

The picture of a target is the image that excites it most, found by gradient ascent on a parametrised image seen
through random crops and noise (Olah et al. 2017). The rooms, in the order the work flows:

- `natural.py`: the natural-image statistics MACO holds a picture to (colour correlation, magnitude spectrum),
  measured from the photographs in assets/ (`assets/make_spectrum.py`) and shipped;
- `images.py`: the two methods, MACO (Fel et al. 2023: the phase under a fixed magnitude) and pixels with
  augmentations and a total-variation penalty (Ghiasi et al. 2022), and the crops the models see;
- `targets.py`: what is maximised, read from the trace (a dictionary's concept, an MLP's unit, a block's channel, a
  class logit), and across models the normalisation by each model's typical activation;
- `draw.py`: `draw`, the optimisation, B pictures at once, in one model or several (Thasarathan et al. 2025);
  N variants of each pushed apart by a diversity term (Olah et al. 2017), or the pictures that lower them most;
- `alike.py`: whether the models of a dictionary across them see a concept alike: each model's own picture read in
  every model, against the photos' 99th percentile there (`alike`);
- `pictures.py`: every concept's picture of a dictionary, drawn once (`make_pictures`) and shipped beside it
  (`pictures_of`, what the app reads).
"""
from .alike import Alike, alike
from .draw import Drawing, Progress, Settings, draw, transparent
from .images import METHODS, Maco, Pixels
from .pictures import Pictures, make_pictures, pictures_of, save_pictures
from .targets import Channel, Concept, Label, LooksError, Target, Unit

__all__ = ["METHODS", "Alike", "Channel", "Concept", "Drawing", "Label", "LooksError", "Maco", "Pictures", "Pixels",
           "Progress", "Settings", "Target", "Unit", "alike", "draw", "make_pictures", "pictures_of", "save_pictures",
           "transparent"]
