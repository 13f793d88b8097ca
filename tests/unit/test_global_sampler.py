"""The global data position: on any world size every step trains the same global batch, every id of an epoch
once, and a position saved on one world resumes on another at the next global batch."""

from collections import Counter
from itertools import islice

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ftrain.train.loaders import adopt
from ftrain.train.resume_load import world_change_refusal
from ftrain.train.sampler import GlobalSampler, accumulation, sample_generator

SIZE, GLOBAL, SEED = 96, 24, 7


def steps(world: int, count: int, micro: int = 4, start: dict[str, int] | None = None) -> list[list[int]]:
    """The ids each of `count` steps trains, over every rank of `world` (sorted: a multiset per step)."""
    trained: list[list[int]] = [[] for _ in range(count)]
    for rank in range(world):
        sampler = GlobalSampler(SIZE, GLOBAL, micro_batch=micro, seed=SEED, rank=rank, world=world)
        if start is not None:
            sampler.load_state_dict(start)
        micro_batches = sampler.micro_batches()
        for step in range(count):
            for ids in islice(micro_batches, sampler.accumulation):
                assert len(ids) <= micro
                trained[step] += ids.tolist()
    return [sorted(ids) for ids in trained]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_every_world_trains_the_same_global_batch_each_step(world: int) -> None:
    assert steps(world, 9) == steps(1, 9)


def test_every_id_of_an_epoch_is_trained_exactly_once_and_the_next_epoch_is_another_order() -> None:
    per_epoch = SIZE // GLOBAL
    trained = steps(4, 2 * per_epoch)
    first, second = trained[:per_epoch], trained[per_epoch:]
    assert Counter(i for ids in first for i in ids) == Counter(range(SIZE))
    assert Counter(i for ids in second for i in ids) == Counter(range(SIZE))
    assert first != second


def test_an_epoch_tail_shorter_than_a_global_batch_is_left_out() -> None:
    sampler = GlobalSampler(50, 24, seed=SEED)
    sampler.reached(2)
    assert sampler.position().epoch == 1 and sampler.position().offset == 0
    assert sampler.position().consumed == 48


@pytest.mark.parametrize(("saved", "resumed"), [(4, 2), (2, 4), (4, 3), (1, 8)])
def test_a_position_saved_mid_epoch_resumes_on_another_world_at_the_next_global_batch(
    saved: int, resumed: int
) -> None:
    sampler = GlobalSampler(SIZE, GLOBAL, micro_batch=4, seed=SEED, rank=saved - 1, world=saved)
    sampler.reached(5)  # mid-epoch: 4 steps an epoch
    assert sampler.position().epoch == 1 and sampler.position().offset == GLOBAL
    assert steps(resumed, 6, start=sampler.state_dict()) == steps(saved, 11)[5:]


def test_every_rank_accumulates_as_many_micro_batches_and_the_scales_make_a_global_mean() -> None:
    assert [accumulation(GLOBAL, 4, w) for w in (1, 2, 3, 6)] == [6, 3, 2, 1]
    for world in (2, 5, 7):
        samplers = [
            GlobalSampler(SIZE, GLOBAL, micro_batch=2, seed=SEED, rank=r, world=world) for r in range(world)
        ]
        batches = [list(islice(s.micro_batches(), s.accumulation)) for s in samplers]
        assert len({s.accumulation for s in samplers}) == 1
        total = sum(s.loss_scale(len(ids)) for s, mine in zip(samplers, batches, strict=True) for ids in mine)
        assert total == pytest.approx(world)  # averaged over the ranks by DDP: 1, the global batch's mean


def test_bad_numbers_and_a_foreign_position_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one sample per rank"):
        accumulation(2, 1, 4)
    with pytest.raises(ValueError, match="a rank would get an empty micro-batch"):
        accumulation(10, 1, 4)  # slices 3, 3, 2, 2 in 3 micro-batches each
    with pytest.raises(ValueError, match="smaller than one global batch"):
        GlobalSampler(10, 24)
    sampler = GlobalSampler(SIZE, GLOBAL, seed=SEED)
    with pytest.raises(ValueError, match="96 samples with seed 8"):
        GlobalSampler(SIZE, GLOBAL, seed=SEED).load_state_dict({**sampler.state_dict(), "seed": 8})


def test_a_data_loader_over_the_sampler_yields_its_micro_batches() -> None:
    sampler = GlobalSampler(SIZE, GLOBAL, micro_batch=4, seed=SEED, rank=1, world=3)
    loader = iter(DataLoader(DATA, batch_sampler=sampler))
    assert [next(loader)[0].tolist() for _ in range(4)] == [
        ids.tolist() for ids in islice(sampler.micro_batches(), 4)
    ]


def test_a_sample_generator_depends_on_seed_step_and_id_only() -> None:
    def draw(seed: int, step: int, index: int) -> float:
        return float(torch.rand((), generator=sample_generator(seed, step, index)))

    assert draw(1, 2, 3) == draw(1, 2, 3)
    assert len({draw(1, 2, 3), draw(2, 2, 3), draw(1, 3, 3), draw(1, 2, 4)}) == 4


DATA = TensorDataset(torch.arange(SIZE))


def test_a_loader_over_a_global_sampler_saves_the_sampler_and_gets_a_generator_of_its_own() -> None:
    sampler = GlobalSampler(SIZE, GLOBAL, seed=SEED)
    for loader in (DataLoader(DATA, batch_sampler=sampler), StatefulDataLoader(DATA, batch_sampler=sampler)):
        source = adopt(loader)
        assert source.saved is sampler and source.position is sampler
        assert isinstance(loader.generator, torch.Generator)
        assert world_change_refusal(source, 4, 2, 10) is None


def test_a_per_rank_or_absent_loader_on_another_world_is_refused_naming_it() -> None:
    loader = StatefulDataLoader(DATA, sampler=DistributedSampler(DATA, num_replicas=4, rank=0), batch_size=4)
    source = adopt(loader)
    assert source.saved is loader and source.position is None
    assert world_change_refusal(source, 4, 4, 10) is None
    refusal = world_change_refusal(source, 4, 2, 10)
    assert refusal is not None and "StatefulDataLoader keeps a per-rank position" in refusal
    assert "step 10 was saved by 4 ranks and this start has 2" in refusal and refusal.endswith("seen twice")
    assert "no loader with a global data position" in (world_change_refusal(None, 2, 4, 10) or "")
    plain = adopt(DataLoader(DATA, shuffle=True))
    assert plain.saved is None and "has no state to resume" in (world_change_refusal(plain, 2, 1, 3) or "")
