"""The machine ftrain runs on, below every other package: the processes ftrain starts and watches itself.

Stdlib only, and nothing of ftrain's: the log (`events`) and the storage (`workers`) both run a server of their
own on this machine, and share the handling here rather than one reaching into the other.
"""
