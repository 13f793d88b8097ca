"""`ftrain export`: a checkpoint the log vouches for, verified as a resume verifies it, written out as the
model's weights (safetensors sharded as Hugging Face shards them, or one `torch.save` file), with its digests
beside it. See docs/export.md."""
