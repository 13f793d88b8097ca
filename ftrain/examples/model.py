"""A small decoder-only transformer, built to be sharded with FSDP2 `fully_shard`, densely or on meta."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

MODELS: dict[str, dict[str, int]] = {
    # a few seconds per hundred steps on two CPU ranks
    "debug": {"vocab": 256, "dim": 64, "layers": 2, "heads": 4, "seq": 32, "batch": 8},
    # 84M parameters: model + AdamW state ≈ 1.0 GB
    "85m": {"vocab": 4096, "dim": 1024, "layers": 6, "heads": 16, "seq": 32, "batch": 2},
}


class Block(nn.Module):
    """Pre-norm attention and MLP with dropout (so the RNG state shapes the trajectory)."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        out: torch.Tensor = x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))
        return out


class TinyGPT(nn.Module):
    """Token + position embeddings, `layers` blocks, a final norm and an untied head."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        loss: torch.Tensor = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return loss

    def init_weights(self, seed: int, rank: int) -> None:
        """Deterministic init that works on dense tensors and on the local shards of DTensors (meta-init):
        each tensor draws from its own generator, seeded by (seed, its index, the rank for a shard)."""
        with torch.no_grad():
            for index, (name, param) in enumerate(self.named_parameters()):
                local = param.to_local() if isinstance(param, DTensor) else param
                if name.endswith("bias"):
                    local.zero_()
                elif ".ln" in name or name.startswith("ln."):
                    local.fill_(1.0)
                else:
                    shard = rank if isinstance(param, DTensor) else 0
                    gen = torch.Generator(device=local.device).manual_seed(
                        seed * 1_000_003 + index * 1_009 + shard
                    )
                    fan_in = param.shape[-1] if param.dim() > 1 else 1
                    local.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)


def parameter_count(config: dict[str, int]) -> int:
    """Parameters of a model config, computed without building it."""
    vocab, dim, layers, seq = config["vocab"], config["dim"], config["layers"], config["seq"]
    block = (
        4 * dim
        + (3 * dim * dim + 3 * dim)
        + (dim * dim + dim)
        + (4 * dim * dim + 4 * dim)
        + (4 * dim * dim + dim)
    )
    return vocab * dim + seq * dim + layers * block + 2 * dim + dim * vocab + vocab
