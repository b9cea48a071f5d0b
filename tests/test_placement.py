"""Placement of a model's blocks by each worker's memory and speed (swarm.placement).

Property tests (seeded) check every placement against the rules (contiguous spans in order,
each worker once, no offer exceeded) and, on small cases, against a brute force over every
placement: one exists exactly when place() finds one, and place()'s slowest span is the best.
"""

from __future__ import annotations

import itertools
import random

import pytest

from swarm.placement import EXACT_WORKERS, Need, Offer, PlacementError, place

MIB = 1 << 20


def valid(need: Need, offers: list[Offer], placement) -> None:
    """The placement covers every block once, in order, with contiguous spans on distinct
    workers, none over its offer."""
    memory = {o.worker: o.memory for o in offers}
    at = 0
    for s in placement.spans:
        assert s.first == at and s.count >= 1
        assert s.bytes == need.span_bytes(s.first, s.count) <= memory[s.worker]
        at += s.count
    assert at == len(need.blocks)
    assert len(set(placement.workers())) == len(placement.spans)


def brute(need: Need, offers: list[Offer]) -> float | None:
    """The least slowest-span time over every placement (None: none fits)."""
    n, best = len(need.blocks), None
    for k in range(1, min(n, len(offers)) + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = [0, *cuts, n]
            for who in itertools.permutations(offers, k):
                t = 0.0
                for o, a, b in zip(who, bounds[:-1], bounds[1:], strict=True):
                    need_b = need.span_bytes(a, b - a)
                    if need_b > o.memory:
                        break
                    t = max(t, need_b / o.speed)
                else:
                    best = t if best is None else min(best, t)
    return best


def random_case(rng: random.Random, equal_blocks: bool) -> tuple[Need, list[Offer]]:
    n = rng.randint(1, 7)
    size = rng.randint(1, 40)
    blocks = tuple(size if equal_blocks else rng.randint(1, 40) for _ in range(n))
    need = Need(blocks, rng.choice([0, 0, 3]))
    w = rng.randint(1, 4)
    offers = [Offer(f"w{i}", rng.randint(0, 120), rng.choice([0.5, 1.0, 2.0, 3.0]))
              for i in range(w)]
    return need, offers


@pytest.mark.parametrize("equal_blocks", [True, False])
def test_place_finds_a_placement_exactly_when_one_exists_and_the_best_one(equal_blocks):
    rng = random.Random(46 + equal_blocks)
    found = refused = 0
    for _ in range(400):
        need, offers = random_case(rng, equal_blocks)
        want = brute(need, offers)
        try:
            got = place(need, offers)
        except PlacementError as exc:
            assert want is None, (need, offers)
            assert exc.shortfall > 0
            refused += 1
            continue
        assert want is not None
        valid(need, offers, got)
        assert len(offers) <= EXACT_WORKERS
        assert got.time == pytest.approx(want, rel=1e-9), (need, offers)
        found += 1
    assert found > 100 and refused > 50  # both sides were exercised


def test_many_workers_of_any_size_get_valid_placements():
    rng = random.Random(7)
    for _ in range(30):
        n = rng.randint(1, 64)
        need = Need(tuple([rng.randint(20, 30) * MIB] * n), rng.randint(0, 4) * MIB)
        offers = [Offer(i, rng.randint(0, 600) * MIB, rng.uniform(0.2, 5.0))
                  for i in range(rng.randint(EXACT_WORKERS + 1, 40))]
        try:
            got = place(need, offers)
        except PlacementError:
            # equal blocks: a refusal is exact, so even the most a worker can hold, summed
            # over the workers, falls short
            per = need.blocks[0] + need.cache
            assert sum(o.memory // per for o in offers) < n
            continue
        valid(need, offers, got)


def test_faster_workers_take_more_blocks():
    need = Need(tuple([10] * 30))
    got = place(need, [Offer("slow", 10_000, 1.0), Offer("fast", 10_000, 2.0)])
    assert {s.worker: s.count for s in got.spans} == {"fast": 20, "slow": 10}


def test_larger_workers_take_more_blocks_when_memory_binds():
    # Qwen2.5-1.5B's shape: 28 blocks of ~28 MiB, none of three 450M workers holds them all
    need = Need(tuple([28 * MIB] * 28), 4 * MIB)
    got = place(need, [Offer("a", 450 * MIB), Offer("b", 450 * MIB), Offer("c", 450 * MIB)])
    counts = [s.count for s in got.spans]
    assert len(counts) == 3 and max(counts) == 10  # ceil(28 / 3): the slowest is the best
    got = place(need, [Offer("small", 200 * MIB), Offer("big", 800 * MIB)])
    counts = {s.worker: s.count for s in got.spans}
    assert counts == {"small": 6, "big": 22}  # the small one is full, the big one takes the rest


def test_a_model_that_fits_nowhere_is_refused_with_the_shortfall_named():
    need = Need(tuple([28 * MIB] * 28), 4 * MIB)  # 896 MiB
    with pytest.raises(PlacementError, match=r"896\.0 MiB .* 600\.0 MiB: 296\.0 MiB short") as e:
        place(need, [Offer("a", 300 * MIB), Offer("b", 300 * MIB)])
    assert e.value.shortfall == 296 * MIB
    with pytest.raises(PlacementError, match=r"largest block needs 32\.0 MiB .* 2\.0 MiB short"):
        place(need, [Offer(i, 30 * MIB) for i in range(100)])
    with pytest.raises(PlacementError, match="no worker offers memory"):
        place(need, [])


def test_blocks_that_fit_in_total_but_not_as_spans_are_refused():
    # 120 bytes fit the 120 offered, each block fits a worker, but no worker holds two
    need = Need((40, 40, 40))
    with pytest.raises(PlacementError, match="do not split"):
        place(need, [Offer("a", 60), Offer("b", 60)])


def test_placement_ignores_the_order_of_offers_and_workers_that_cannot_help():
    need = Need(tuple([5] * 12), 1)
    offers = [Offer(f"w{i}", m, s) for i, (m, s) in
              enumerate([(30, 1.0), (0, 9.0), (50, 2.0), (3, 4.0), (24, 1.5)])]
    got = place(need, offers)
    for seed in range(5):
        shuffled = offers[:]
        random.Random(seed).shuffle(shuffled)
        assert place(need, shuffled) == got
    assert not {"w1", "w3"} & set(got.workers())  # no memory, or less than one block


def test_one_worker_takes_every_block_and_more_workers_than_blocks_is_fine():
    need = Need((7, 7, 7))
    assert place(need, [Offer("only", 21)]).plan() == [(0, 3)]
    got = place(need, [Offer(i, 100) for i in range(10)])
    assert got.plan() == [(0, 1), (1, 1), (2, 1)]


@pytest.mark.parametrize("need, offers, why", [
    (Need(()), [Offer("a", 1)], "1..4096 blocks"),
    (Need((1, -1)), [Offer("a", 1)], "ints >= 0"),
    (Need((1,), -1), [Offer("a", 1)], "ints >= 0"),
    (Need((1,)), [Offer("a", 1), Offer("a", 2)], "each worker offers once"),
    (Need((1,)), [Offer("a", -1)], "memory is an int >= 0 and speed > 0"),
    (Need((1,)), [Offer("a", 1, 0.0)], "speed > 0"),
    (Need((1,)), [Offer("a", 1, float("nan"))], "speed > 0"),
])
def test_bad_input_is_a_clear_error(need, offers, why):
    with pytest.raises(ValueError, match=why):
        place(need, offers)
