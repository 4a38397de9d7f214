"""Hardware-aware widths (pipeline/methods/widths.py, its command pipeline/studies/widths.py, budgeted_search.search's
neuron blocks): the budget search keeps each layer's FFN neurons in whole blocks of the measured multiple, within the
same budget."""

from __future__ import annotations

import pytest
import torch

from pipeline.methods.budgeted_costs import UnitCosts
from pipeline.methods.budgeted_search import neuron_blocks, search
from pipeline.methods.widths import CANDIDATES, probe_width_multiple, smallest_near_best
from pipeline.studies.widths import main


def costs(heads: list[int], neurons: list[int]) -> UnitCosts:
    total = 50.0 + 10.0 * sum(heads) + sum(neurons)
    return UnitCosts([10.0] * len(heads), [1.0] * len(neurons), heads, neurons, total, "FLOPs")


def fishers(seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(4, generator=g) for _ in range(3)], [torch.rand(37, generator=g) * 0.3 for _ in range(3)]


def test_neuron_blocks_cut_each_layers_ranking_most_important_first_with_the_remainder_last():
    blocks = neuron_blocks([torch.tensor([0.1, 0.9, 0.5, 0.7, 0.3])], 2)
    assert blocks == [[[1, 3], [2, 4], [0]]]
    assert neuron_blocks([torch.tensor([0.2, 0.2, 0.1])], 1) == [[[0], [1], [2]]]  # ties in index order


def test_with_a_multiple_every_kept_width_is_a_multiple_or_the_full_width_and_the_budget_holds():
    head_fisher, neuron_fisher = fishers()
    budget = costs([4] * 3, [37] * 3)
    for keep in (0.9, 0.7, 0.5, 0.35):
        chosen = search(head_fisher, neuron_fisher, budget, keep, neuron_multiple=8)
        heads, neurons = chosen.counts
        assert budget.cost(heads, neurons) <= keep * budget.total + 1e-9
        assert all(n % 8 == 0 or n == 37 for n in neurons), neurons


def test_a_multiple_of_one_is_the_unrounded_search_and_rounding_never_adds_importance():
    head_fisher, neuron_fisher = fishers(1)
    budget = costs([4] * 3, [37] * 3)

    def importance(selection) -> float:
        return (sum(float(f[s].sum()) for f, s in zip(head_fisher, selection.heads, strict=True))
                + sum(float(f[s].sum()) for f, s in zip(neuron_fisher, selection.neurons, strict=True)))

    for keep in (0.8, 0.5):
        plain = search(head_fisher, neuron_fisher, budget, keep)
        assert search(head_fisher, neuron_fisher, budget, keep, neuron_multiple=1) == plain
        assert importance(search(head_fisher, neuron_fisher, budget, keep, neuron_multiple=16)) <= importance(plain)


def test_the_chosen_multiple_is_the_smallest_within_the_tolerance_of_the_best():
    assert smallest_near_best({1: 0.80, 4: 0.99, 8: 1.00, 16: 1.01}) == 4
    assert smallest_near_best({1: 1.00, 8: 1.02}) == 1
    assert smallest_near_best({1: 0.70, 8: 0.90, 16: 1.00}, tolerance=0.05) == 16


def test_the_probe_measures_every_candidate_on_this_device_and_picks_one_of_them():
    probe = probe_width_multiple(hidden=16, full=64, token_counts=[8, 32], widths=4, rounds=2)
    assert list(probe.efficiency) == list(CANDIDATES) and all(e > 0 for e in probe.efficiency.values())
    assert probe.multiple == smallest_near_best(probe.efficiency)


def test_the_probe_command_prints_each_candidate_and_the_integer_to_pin(capsys):
    main(["--device", "cpu", "--tokens", "16", "--rounds", "1"])
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1].rstrip(":") for line in out[1:-1]] == [str(m) for m in CANDIDATES]
    pinned = int(out[-1].removeprefix("prune.budgeted.width_multiple: "))
    assert pinned in CANDIDATES and sum("<- chosen" in line for line in out) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_probe_command_refuses_a_gpu_this_machine_lacks_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cuda", "--tokens", "16"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and "--device: 'cuda' but this machine has no CUDA GPU" in err
