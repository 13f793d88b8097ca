"""ftrain: checkpoint-and-resume for long distributed PyTorch jobs, every lifecycle transition recorded as a
signed, hash-chained event. Importing it sets no log output up beyond quiet defaults (`ftrain.logs`)."""

from ftrain import logs as _logs

_logs.library_defaults()
