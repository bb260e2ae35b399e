"""Probes for minitron-0004 (ZeRO-1 sharded Adam)."""

from minitron.comm import ProcessGroup, launch
from minitron.model import MLP
from minitron.optimizer import DistributedAdam
from minitron.train import train_steps


def _state_and_traffic(group):
    m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
    opt = DistributedAdam(m, group, lr=1e-2)
    train_steps(m, opt, 1, group=group)
    before = group.bytes_sent
    opt.step()
    moments = sum(a.size for a in opt.exp_avg.values()) + sum(a.size for a in opt.exp_avg_sq.values())
    params = sum(p.size for _, p, _ in m.named_parameters())
    return moments, params, group.bytes_sent - before, sum(p.nbytes for _, p, _ in m.named_parameters())


def test_each_rank_keeps_moments_for_its_share_only():
    out = launch(_state_and_traffic, 4)
    params = out[0][1]
    assert sum(o[0] for o in out) == 2 * params, "the ranks' moments together cover each parameter once"


def test_a_step_sends_only_the_owned_slices():
    out = launch(_state_and_traffic, 4)
    nbytes = out[0][3]
    # Every rank sends its owned quarter of every parameter to the 3 other ranks.
    assert sum(o[2] for o in out) == 3 * nbytes
