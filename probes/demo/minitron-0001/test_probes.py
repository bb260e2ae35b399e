"""Hidden probes for minitron-0001 (optimizer state in checkpoints)."""

import numpy as np
import pytest

from minitron.checkpoint import load_checkpoint, save_checkpoint
from minitron.comm import ProcessGroup, launch
from minitron.model import MLP
from minitron.optimizer import Adam
from minitron.train import train_steps


def _local():
    return ProcessGroup(0, 1, {})


def test_state_dict_is_a_snapshot():
    m = MLP(8, 16, 4, _local(), seed=0)
    opt = Adam(m, lr=1e-2)
    train_steps(m, opt, 2)
    state = opt.state_dict()
    before = {n: a.copy() for n, a in state["exp_avg"].items()}
    train_steps(m, opt, 2, seed=2)
    assert state["step"] == 2
    for n, a in before.items():
        np.testing.assert_array_equal(state["exp_avg"][n], a, err_msg=f"exp_avg[{n}] changed after later steps")


def _train_save_load(group, path):
    m = MLP(8, 16, 4, group, seed=0)
    opt = Adam(m, lr=1e-2)
    for step in range(3):  # each rank holds different shards, so their states differ
        m.zero_grad()
        out = m.forward(np.full((4, 8), step + 1.0, np.float32))
        m.backward(out)
        opt.step()
    save_checkpoint(path, m, optimizer=opt, rank=group.rank, world_size=group.world_size)
    group.barrier()
    fresh = MLP(8, 16, 4, group, seed=9)
    fopt = Adam(fresh, lr=1e-2)
    load_checkpoint(path, fresh, optimizer=fopt, rank=group.rank)
    same = fopt.step_count == opt.step_count and all(
        np.array_equal(fopt.exp_avg[n], opt.exp_avg[n]) for n in opt.exp_avg)
    return same


def test_tensor_parallel_ranks_resume_their_own_optimizer_state(tmp_path):
    assert launch(_train_save_load, 2, str(tmp_path)) == [True, True]


def test_loading_optimizer_from_model_only_checkpoint_raises(tmp_path):
    m = MLP(8, 16, 4, _local(), seed=0)
    save_checkpoint(str(tmp_path), m)
    with pytest.raises(KeyError):
        load_checkpoint(str(tmp_path), m, optimizer=Adam(m))
