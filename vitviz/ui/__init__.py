"""vitviz's web app as a package: `page.py` lays out the page and its first screen, one module per tab
(its layout and its handlers), `gpu/` the only functions that run a model (what `spaces.GPU`
decorates), `store.py` the sessions kept in the app's process. Only this package and app.py import
gradio."""
from .page import STYLE, build, pairs_at_hand

__all__ = ["STYLE", "build", "pairs_at_hand"]
