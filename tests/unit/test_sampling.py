"""Sampling on the logits' device: the distribution softmax(logits / temperature) over
the tokens top-k and top-p keep, seeds that give the same tokens in any batch, greedy
rows, and a row with bad logits failing alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tradeoff.generate.sampling import (  # noqa: E402
    FAILED,
    SamplingBatch,
    sample,
    sample_tokens,
    uniform,
)
from tradeoff.generate.sampling_params import SamplingParams, as_seed  # noqa: E402

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def draws(params: SamplingParams, rows: int = 40_000) -> torch.Tensor:
    """How often each token is drawn from LOGITS over ``rows`` rows with their own
    seeds (one step each)."""
    batch = SamplingBatch.of([params] * rows, list(range(rows)), [0] * rows, len(LOGITS))
    tokens = sample_tokens(LOGITS.expand(rows, -1), batch)
    return torch.bincount(tokens, minlength=len(LOGITS)).double() / rows


def expected(temperature: float, keep: list[int]) -> torch.Tensor:
    scaled = LOGITS.double() / temperature
    probs = torch.zeros_like(scaled)
    probs[keep] = scaled[keep].softmax(dim=0)
    return probs


def assert_close(seen: torch.Tensor, want: torch.Tensor, rows: int = 40_000) -> None:
    """Within 5 standard errors of each token's probability (and 0 where it is 0)."""
    bound = 5 * torch.sqrt(want * (1 - want) / rows) + 1e-9
    assert ((seen - want).abs() <= bound).all(), (seen, want)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 1.7])
def test_draws_follow_the_softmax(temperature: float) -> None:
    assert_close(draws(SamplingParams(temperature=temperature)),
                 expected(temperature, list(range(6))))


def test_top_k_and_top_p_keep_what_they_should() -> None:
    assert_close(draws(SamplingParams(temperature=1.0, top_k=3)), expected(1.0, [0, 1, 2]))
    cumulative = expected(1.0, list(range(6))).cumsum(0)  # 0.56, 0.77, 0.89, 0.97, ...
    assert cumulative[0] < 0.7 < cumulative[1] and cumulative[2] < 0.9 < cumulative[3]
    assert_close(draws(SamplingParams(temperature=1.0, top_p=0.7)), expected(1.0, [0, 1]))
    assert_close(draws(SamplingParams(temperature=1.0, top_k=5, top_p=0.9)),
                 expected(1.0, [0, 1, 2, 3]))  # top_p keeps the first token past it
    assert_close(draws(SamplingParams(temperature=1.0, top_k=3, top_p=0.99)),
                 expected(1.0, [0, 1, 2]))


def test_the_uniforms_are_uniform_and_a_pure_function_of_seed_and_counter() -> None:
    seeds = torch.arange(20_000) * 7919 - 10**9
    counters = torch.arange(20_000) % 13
    numbers = uniform(seeds, counters)
    assert numbers.dtype == torch.float64 and numbers.min() > 0 and numbers.max() < 1
    assert abs(float(numbers.mean()) - 0.5) < 0.01
    assert abs(float(numbers.var()) - 1 / 12) < 0.005
    assert torch.histc(numbers, bins=10, min=0, max=1).min() > 1800  # about 2,000 each
    # a row's number does not depend on the other rows; seeds 2**64 - 1 and -1 are one
    assert float(uniform(seeds[5:6], counters[5:6])[0]) == float(numbers[5])
    assert torch.equal(uniform(torch.tensor([as_seed(2**64 - 1)]), torch.tensor([3])),
                       uniform(torch.tensor([-1]), torch.tensor([3])))
    # one sequence's successive numbers are not correlated
    steps = uniform(torch.full((20_000,), 42), torch.arange(20_000))
    pairs = torch.corrcoef(torch.stack([steps[:-1], steps[1:]]))
    assert abs(float(pairs[0, 1])) < 0.03


def test_a_seeded_row_draws_the_same_whatever_its_batch() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 300, generator=generator)
    mine = SamplingParams(temperature=0.8, top_p=0.95, seed=42)
    others = [SamplingParams(temperature=t, top_k=k) for t, k in ((1.0, 0), (0.0, 0),
                                                                  (1.3, 7), (0.5, 0))]
    together = sample(logits, [mine, *others], [42, 1, 2, 3, 4], [3, 0, 0, 0, 0])
    alone = sample(logits[:1], [mine], [42], [3])
    assert together[0] == alone[0]
    # with no other row needing a sort, the same token too
    assert sample(logits[:1], [SamplingParams(temperature=0.8, seed=42)], [42], [3]) == \
        sample(logits[:2], [SamplingParams(temperature=0.8, seed=42), others[0]],
               [42, 9], [3, 0])[:1]
    # the next token of the same sequence draws fresh noise
    steps = {sample(logits[:1], [mine], [42], [n])[0] for n in range(40)}
    assert len(steps) > 1


def test_greedy_rows_take_the_top_token_and_bad_rows_fail_alone() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [float("nan"), 1.0, 0.0],
                           [float("-inf")] * 3, [5.0, 1.0, 0.0]])
    greedy = SamplingParams(temperature=0.0)
    hot = SamplingParams(temperature=1e-30)  # would overflow if divided by
    assert sample(logits, [greedy, greedy, greedy, hot], [1, 2, 3, 4], [0] * 4) == \
        [1, FAILED, FAILED, 0]
    sampled = SamplingParams(temperature=1.0, top_p=0.5)
    tokens = sample(logits, [sampled] * 4, [1, 2, 3, 4], [0] * 4)
    assert tokens[1] == tokens[2] == FAILED and tokens[0] in (1, 2) and tokens[3] == 0


def test_seeds_outside_64_bits_are_refused() -> None:
    from tradeoff.errors import InvalidInput

    for seed in (2**64, -(2**63) - 1):
        with pytest.raises(InvalidInput, match="seed"):
            SamplingParams(seed=seed)
    assert as_seed(2**64 - 1) == -1 and as_seed(5) == 5 and as_seed(-(2**63)) == -(2**63)
