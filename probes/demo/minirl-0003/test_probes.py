"""Probes for minirl-0003 (padding batches to a divisor).

The judge (this module) never imports minirl: each probe drives the code under test in a child
process on fresh sizes and checks the plain data it sends back against what the judge computes
or against gold's on the same seed."""

import numpy as np

from infradev_probe import fresh, reference, run, same


def test_padding_leaves_the_input_alone():
    rng = fresh()
    n, divisor = int(rng.integers(3, 12)), int(rng.integers(2, 9))
    while n % divisor == 0:
        n += 1
    rows = rng.integers(0, 1 << 30, size=n)
    out = run("""
        import numpy as np
        from minirl.protocol import DataProto, pad_dataproto_to_divisor

        d = DataProto({"a": np.array(ARGS["rows"])})
        padded, pad = pad_dataproto_to_divisor(d, ARGS["divisor"])
        emit(padded_len=len(padded), pad=int(pad), padded_a=np.asarray(padded.batch["a"]),
             input_len=len(d), input_a=np.asarray(d.batch["a"]))
    """, {"rows": rows, "divisor": divisor})
    pad = -n % divisor
    assert (out["padded_len"], out["pad"]) == (n + pad, pad), f"padded to {out['padded_len']} rows with pad {out['pad']}"
    np.testing.assert_array_equal(out["padded_a"], np.concatenate([rows, np.resize(rows, pad)]), err_msg="padded rows")
    assert out["input_len"] == n, f"the input now has {out['input_len']} rows"
    np.testing.assert_array_equal(out["input_a"], rows, err_msg="the input's rows changed")


_ROLLOUT = """
import numpy as np
from minirl.trainer import PPOTrainer

t = PPOTrainer(batch_size=ARGS["batch_size"], n=ARGS["n"], num_rollout_workers=ARGS["workers"], seed=ARGS["seed"])
batch = t.rollout(0)
emit(rows=len(batch), columns={k: np.asarray(v) for k, v in batch.batch.items()})
"""


def test_rollout_returns_exactly_the_requested_rows():
    rng = fresh()
    n = int(rng.integers(1, 3))
    # Rows that do not split evenly: two workers never leave a remainder of 2 x batch rows.
    workers = int(rng.choice([3, 4] if n == 2 else [2, 3, 4]))
    batch_size = int(rng.integers(2, 8))
    while (batch_size * n) % workers == 0:
        batch_size += 1
    args = {"batch_size": batch_size, "n": n, "workers": workers, "seed": int(rng.integers(1 << 20))}
    got, want = run(_ROLLOUT, args), reference(_ROLLOUT, args)
    assert got["rows"] == batch_size * n, f"rollout returned {got['rows']} rows, want {batch_size * n}"
    np.testing.assert_array_equal(got["columns"]["uid"], np.repeat(np.arange(batch_size), n))
    same(got, want)
