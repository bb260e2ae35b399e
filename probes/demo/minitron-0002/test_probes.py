"""Hidden probes for minitron-0002 (bucketed gradient all-reduce).

The judge (this module) never imports minitron: each probe drives the code under test in a
child process and compares the plain data it sends back."""

import numpy as np

from infradev_probe import run

# MLP(8, 16, 4) on one tensor-parallel rank, in named_parameters() order: fc1.bias, fc1.weight,
# fc2.bias, fc2.weight (float32).
SHAPES = {"fc1.bias": (16,), "fc1.weight": (8, 16), "fc2.bias": (4,), "fc2.weight": (16, 4)}
GRAD_BYTES = sum(int(np.prod(s)) for s in SHAPES.values()) * 4  # 848


def _traffic(bucket):
    """All-reduces distinct gradients over two ranks; returns each rank's traffic and gradients."""
    return run("""
        import numpy as np
        from minitron.comm import ProcessGroup, launch
        from minitron.model import MLP
        from minitron.train import allreduce_gradients

        def rank(group, bucket):
            m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
            for _, _, g in m.named_parameters():
                g[...] = np.arange(g.size, dtype=np.float32).reshape(g.shape) * (group.rank + 1)
            allreduce_gradients(m, group, bucket_size_bytes=bucket)
            return {"messages": group.messages_sent, "bytes": group.bytes_sent,
                    "names": [n for n, _, _ in m.named_parameters()],
                    "grads": {n: np.array(g) for n, _, g in m.named_parameters()}}

        emit(ranks=launch(rank, 2, ARGS["bucket"]))
    """, {"bucket": bucket})["ranks"]


def _check(ranks, messages):
    assert len(ranks) == 2
    for r, got in enumerate(ranks):
        # Two ranks: each all-reduce sends one message to the one peer.
        assert (got["messages"], got["bytes"]) == (messages, GRAD_BYTES), \
            f"rank {r}: {got['messages']} messages of {got['bytes']} bytes in all"
        assert sorted(got["names"]) == sorted(SHAPES), f"rank {r}: parameters {got['names']}"
        for name, shape in SHAPES.items():
            g = got["grads"][name]
            # Rank 0 holds arange, rank 1 twice that: their mean is 1.5 x arange.
            want = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * 1.5
            assert g.dtype == np.float32, f"rank {r}: {name} became {g.dtype}"
            np.testing.assert_allclose(g, want, rtol=1e-6, err_msg=f"rank {r}: averaged {name}")


def test_one_bucket_is_one_message_of_the_gradients_bytes():
    _check(_traffic(1 << 20), 1)


def test_without_buckets_and_with_tiny_buckets_each_gradient_goes_alone():
    _check(_traffic(None), 4)
    _check(_traffic(8), 4)


def test_train_steps_uses_the_buckets():
    out = run("""
        from minitron.comm import ProcessGroup, launch
        from minitron.model import MLP
        from minitron.optimizer import SGD
        from minitron.train import train_steps

        def rank(group, bucket):
            m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
            train_steps(m, SGD(m, lr=0.05), 2, group=group, bucket_size_bytes=bucket)
            return group.messages_sent

        emit(messages=launch(rank, 2, ARGS["bucket"]))
    """, {"bucket": 1 << 20})
    assert out["messages"] == [2, 2]  # one all-reduce per step
