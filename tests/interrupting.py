"""Activations that stop a training run part way, as Ctrl-C would (the resume tests)."""


class Interrupting:
    """A re-iterable list of batches that raises KeyboardInterrupt once, as its `at`-th batch overall is read."""

    def __init__(self, batches, at):
        self.batches, self.at, self.read = batches, at, 0

    def __iter__(self):
        for batch in self.batches:
            self.read += 1
            if self.read == self.at:
                raise KeyboardInterrupt
            yield batch
