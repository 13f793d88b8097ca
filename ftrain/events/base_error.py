"""The one base class of every error ftrain raises to the code that calls it, so a script or a tool catches
them all with one `except FtrainError`. Defined here, at the bottom of the layers, so that the log, the
workers and the trainer can all derive from it; `ftrain.errors` is the module users import, and documents
the tree."""


class FtrainError(Exception):
    """An error ftrain raises on purpose: its message is one line saying what happened and what to do next."""
