"""Training dictionaries: one model's (`train`, `single.py`) and one across models (`train_across`, `across.py`),
both through one loop (`loop.py`: the schedule and its warm-up, the progress kept on the device, checkpoints that
resume exactly)."""
from .across import train_across
from .loop import PROGRESS_EVERY
from .single import auxk, train

__all__ = ["PROGRESS_EVERY", "auxk", "train", "train_across"]
