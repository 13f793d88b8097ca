"""The machine ftrain runs on, below every other package: the processes ftrain starts, watches and signals.

Nothing of ftrain's is imported here: the log (`events`) and the storage (`workers`) both run a server of their
own on this machine, and the supervisor and the trainer both signal a torchrun job; each shares the handling
here rather than one reaching into the other.
"""
