"""vitviz: see inside vision transformers."""
