"""The user's experiment tracker (MLflow, W&B): one tracker run across every attempt of an ftrain run, and
ftrain's own lifecycle written there. Nothing here imports a tracker's package; the control-plane commands and
`events`/`projections` never import this package."""
