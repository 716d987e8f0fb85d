"""Per-request choice between the drafter's block and a retrieval chain (control/source_choice.py)."""

import torch

from sglang_dspark.control.source_choice import choose_retrieval, proposal_value, skip_drafting


def test_value_is_the_best_prefix_gain_at_the_token_price():
    conf = torch.tensor([[1.0, 0.5, 0.5, 0.0], [0.2, 0.2, 0.2, 0.2]])
    free = proposal_value(conf)  # price 0: the whole expected accepted length
    assert torch.allclose(free, torch.tensor([1.0 + 0.5 + 0.25, 0.2 + 0.04 + 0.008 + 0.0016]))
    priced = proposal_value(conf, token_price=0.3)
    assert torch.allclose(priced, torch.tensor([0.7 + 0.2, 0.0]))  # stop after 2 drafts; verify none of row 1


def test_the_better_curve_wins_and_load_favours_the_steeper_start():
    drafter = torch.tensor([[0.9, 0.1, 0.1, 0.1], [0.5, 0.5, 0.5, 0.5]])
    chain = torch.tensor([[0.6, 0.9, 0.9, 0.9], [0.5, 0.5, 0.5, 0.5]])
    drafted = torch.tensor([True, True])
    has = torch.tensor([True, True])
    idle = choose_retrieval(drafter, drafted, chain, has, token_price=0.0)
    assert idle.tolist() == [True, True]  # row 0: 0.6 * (1 + .9 + .81 + .729) > 0.9 + 0.09 + ...; row 1: tie -> chain
    loaded = choose_retrieval(drafter, drafted, chain, has, token_price=0.55)
    assert loaded.tolist()[0] is False  # one sure-ish token beats a long unsure chain when tokens are dear


def test_undrafted_requests_take_any_worthwhile_chain_and_no_chain_means_the_drafter():
    zero = torch.zeros(2, 3)
    chain = torch.tensor([[0.3, 0.0, 0.0], [0.0, 0.0, 0.0]])
    got = choose_retrieval(zero, torch.tensor([False, False]), chain, torch.tensor([True, True]))
    assert got.tolist() == [True, False]  # an all-zero chain is not worth verifying
    got = choose_retrieval(torch.full((2, 3), 0.9), torch.tensor([True, True]), torch.ones(2, 3),
                           torch.tensor([False, False]))
    assert got.tolist() == [False, False]


def test_skip_drafting_needs_a_measured_drafter_and_a_chain_at_least_as_good():
    chain = torch.tensor([[0.9, 0.9, 0.0], [0.1, 0.0, 0.0], [0.9, 0.9, 0.9]])
    has = torch.tensor([True, True, False])
    assert skip_drafting(chain, has, None).tolist() == [False, False, False]
    assert skip_drafting(chain, has, 0.5).tolist() == [True, False, False]


def test_unexplored_chains_are_valued_at_price_zero():
    chain = torch.tensor([[0.3, 0.3, 0.0], [0.3, 0.3, 0.0]])
    none = torch.zeros(2, 3)
    got = choose_retrieval(none, torch.tensor([False, False]), chain, torch.tensor([True, True]), token_price=0.5,
                           unexplored=torch.tensor([True, False]))
    assert got.tolist() == [True, False]  # priced out once its cell has been observed, explored before
