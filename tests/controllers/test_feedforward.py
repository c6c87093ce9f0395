"""The feedforward KL coefficient: β at which the KL-regularised optimum sits at a target."""

from __future__ import annotations

import math

import pytest

from actuator.controllers import KLStart, ParameterError, kl_coefficient_for_target


def tilt_kl(rewards: list[float], beta: float) -> float:
    """Exact KL(π* ‖ π_ref) for π_ref uniform over ``rewards``' answers and π* ∝ π_ref·exp(r/β)."""
    weights = [math.exp(r / beta) for r in rewards]
    z = sum(weights)
    n = len(rewards)
    return sum(w / z * math.log((w / z) * n) for w in weights)


def test_beta_from_variance_length_and_target() -> None:
    # two prompts, rewards {0, 1}: sample variance 0.5 each; 10 tokens per answer; 0.05 nats/token
    start = kl_coefficient_for_target([[0.0, 1.0], [1.0, 0.0]], [10] * 4, 0.05)
    assert isinstance(start, KLStart)
    assert start.reward_variance == pytest.approx(0.5)
    assert start.mean_length == pytest.approx(10.0)
    assert start.sequence_target == pytest.approx(0.5)
    assert start.beta == pytest.approx(math.sqrt(0.5 / (2 * 0.5)))
    assert start.groups == 2


def test_beta_puts_the_exact_tilt_at_the_target_when_the_reward_is_small() -> None:
    """The second-order formula is the tilt's small-r/β limit: for a reward small against β the
    exact KL of the tilted optimum at the returned β equals the sequence target within 2%."""
    rewards = [0.0, 0.02, 0.05, 0.1, 0.03, 0.0, 0.08, 0.01]
    start = kl_coefficient_for_target([rewards], [4] * len(rewards), 1e-5)
    # the formula uses the sample variance (n − 1); the uniform tilt's KL the population one
    n = len(rewards)
    exact = tilt_kl(rewards, start.beta) * n / (n - 1)
    assert exact == pytest.approx(start.sequence_target, rel=0.02)
    # and a larger target needs a smaller β (KL falls as β grows)
    assert kl_coefficient_for_target([rewards], [4] * n, 4e-5).beta == pytest.approx(start.beta / 2)


def test_prompts_with_one_sample_are_ignored() -> None:
    with_single = kl_coefficient_for_target([[0.0, 1.0], [7.0]], [5, 5, 5], 0.1)
    assert with_single.groups == 1
    assert with_single.reward_variance == pytest.approx(0.5)


def test_group_scale_weighs_beta_against_the_normalised_advantage() -> None:
    """GRPO's β meets (r − mean)/(std + 1e-4): every group whose reward varies has advantage
    variance ≈ 1 whatever the reward's units, a constant group has 0, so β no longer scales with
    the reward while the raw ("none") β does."""
    groups = [[0.0, 1.0, 1.0, 0.0], [0.2, 0.4, 0.9, 0.1], [3.0, 3.0, 3.0, 3.0]]
    lengths = [10] * 12
    grpo = kl_coefficient_for_target(groups, lengths, 0.05, scale="group")
    assert grpo.scale == "group" and grpo.as_dict()["scale"] == "group"
    # two varying groups at ≈ 1 (the 1e-4 in the denominator shaves a little), the constant one at 0
    assert grpo.reward_variance == pytest.approx(2 / 3, rel=1e-3)
    assert grpo.beta == pytest.approx(math.sqrt((2 / 3) / (2 * 0.05 * 10)), rel=1e-3)
    scaled = kl_coefficient_for_target([[100 * r for r in g] for g in groups], lengths, 0.05, scale="group")
    assert scaled.beta == pytest.approx(grpo.beta, rel=1e-3)  # up to the 1e-4
    raw = kl_coefficient_for_target(groups, lengths, 0.05)
    assert kl_coefficient_for_target([[100 * r for r in g] for g in groups], lengths, 0.05).beta == \
        pytest.approx(100 * raw.beta)


def test_batch_scale_divides_by_the_pooled_std() -> None:
    import statistics

    groups = [[0.0, 1.0], [0.0, 3.0]]
    start = kl_coefficient_for_target(groups, [4] * 4, 0.1, scale="batch")
    std = statistics.stdev([0.0, 1.0, 0.0, 3.0]) + 1e-4
    expected = statistics.fmean([statistics.variance(g) / std ** 2 for g in groups])
    assert start.reward_variance == pytest.approx(expected)


def test_refuses_an_unknown_scale() -> None:
    with pytest.raises(ParameterError) as err:
        kl_coefficient_for_target([[0.0, 1.0]], [3, 3], 0.1, scale="dapo")
    assert err.value.field == "scale"


@pytest.mark.parametrize(("groups", "lengths", "target", "field"), [
    ([[1.0]], [3], 0.1, "reward_groups"),                    # no prompt with two answers
    ([[1.0, 1.0], [0.0, 0.0]], [3] * 4, 0.1, "reward_groups"),  # the reward never varies
    ([[0.0, float("nan")]], [3, 3], 0.1, "reward_groups"),
    ([[0.0, 1.0]], [], 0.1, "lengths"),
    ([[0.0, 1.0]], [0, 0], 0.1, "lengths"),
    ([[0.0, 1.0]], [-1, 3], 0.1, "lengths"),
    ([[0.0, 1.0]], [3, 3], 0.0, "target"),
])
def test_refuses_data_that_cannot_give_a_beta(groups: list[list[float]], lengths: list[int], target: float,
                                              field: str) -> None:
    with pytest.raises(ParameterError) as err:
        kl_coefficient_for_target(groups, lengths, target)
    assert err.value.field == field
