"""The machine ftrain runs on, below every other package: what ftrain asks of the operating system.

Files and directories kept private whatever the umask, atomic writes, removing without following links; the
processes ftrain starts, watches and signals, and how a process dies with its parent. Nothing of ftrain's is
imported here: the log, the storage, the supervisor and the trainer share it rather than one reaching into
another.
"""
