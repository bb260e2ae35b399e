"""Probes for minirl-0003 (padding batches to a divisor).

The judge (this module) never imports minirl: each probe drives the code under test in a child
process and checks the plain data it sends back."""

import numpy as np

from infradev_probe import run


def test_padding_leaves_the_input_alone():
    out = run("""
        import numpy as np
        from minirl.protocol import DataProto, pad_dataproto_to_divisor

        d = DataProto({"a": np.arange(5)})
        padded, pad = pad_dataproto_to_divisor(d, 2)
        emit(padded_len=len(padded), pad=int(pad), padded_a=np.asarray(padded.batch["a"]),
             input_len=len(d), input_a=np.asarray(d.batch["a"]))
    """)
    assert out["padded_len"] == 6 and out["pad"] == 1, f"padded to {out['padded_len']} rows with pad {out['pad']}"
    np.testing.assert_array_equal(out["padded_a"], [0, 1, 2, 3, 4, 0], err_msg="padded rows")
    assert out["input_len"] == 5, f"the input now has {out['input_len']} rows"
    np.testing.assert_array_equal(out["input_a"], np.arange(5), err_msg="the input's rows changed")


def test_rollout_returns_exactly_the_requested_rows():
    out = run("""
        import numpy as np
        from minirl.trainer import PPOTrainer

        t = PPOTrainer(batch_size=5, n=1, num_rollout_workers=2, seed=8)
        batch = t.rollout(0)
        emit(rows=len(batch), columns={k: np.asarray(v) for k, v in batch.batch.items()})
    """)
    assert out["rows"] == 5, f"rollout returned {out['rows']} rows, want 5"
    assert "uid" in out["columns"], f"no uid column among {sorted(out['columns'])}"
    np.testing.assert_array_equal(out["columns"]["uid"], np.arange(5))
    for k, v in out["columns"].items():
        assert len(v) == 5, f"column {k!r} has {len(v)} rows"
