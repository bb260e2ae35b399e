"""Probes for minirl-0002 (trainable-only weight sync).

The judge (this module) never imports minirl. The trainer runs in a child over a transport
whose messages go through the judge (an oracle): the judge counts every byte and message the
actor sends and hands the rollout workers only what it was sent. So the traffic is the judge's
own figure, not what the code under test reports. Seeds and step counts are drawn fresh."""

import numpy as np

from infradev_probe import fresh, reference, run, same


class Wire:
    """The judge's side of the transport: what was sent, message by message."""

    def __init__(self):
        self.sent, self.queued = [], []

    def __call__(self, op, *args):
        if op == "send":
            payload = args[0]
            if not isinstance(payload, dict) or not all(isinstance(v, np.ndarray) for v in payload.values()):
                raise ValueError("a message is a dict of arrays")
            self.sent.append({k: np.array(v) for k, v in payload.items()})
            self.queued.append(payload)
            return None
        if op == "receive_all":
            out, self.queued = self.queued, []
            return out
        raise ValueError("unknown operation")

    @property
    def bytes(self):
        return sum(v.nbytes for m in self.sent for v in m.values())


# The trainer's transport is the judge's: minirl's Transport is replaced before the trainer is
# made, so every message goes through ORACLE.
_DRIVER = """
import numpy as np
import minirl.trainer
import minirl.transport

class JudgeTransport:
    def __init__(self):
        self.bytes_sent = self.messages_sent = 0

    def send(self, payload):
        payload = {k: np.ascontiguousarray(v) for k, v in payload.items()}
        self.bytes_sent += sum(v.nbytes for v in payload.values())
        self.messages_sent += 1
        ORACLE("send", payload)

    def receive_all(self):
        return [{k: np.array(v) for k, v in m.items()} for m in ORACLE("receive_all")]

minirl.transport.Transport = minirl.trainer.Transport = JudgeTransport
from minirl.trainer import PPOTrainer

t = PPOTrainer(batch_size=ARGS["batch_size"], n=2, num_rollout_workers=ARGS["workers"], seed=ARGS["seed"])
policy = t.actor.policy
t.fit(ARGS["steps"])
emit(params=dict(policy.params), trainable=sorted(str(k) for k in policy.trainable),
     workers=[dict(w.policy.params) for w in t.workers])
"""


def _scenario(workers):
    # The batch (batch_size x 2 rows) splits evenly over the workers.
    rng = fresh()
    w = workers(rng)
    return {"seed": int(rng.integers(1 << 20)), "steps": int(rng.integers(2, 5)),
            "batch_size": w * int(rng.integers(1, 4)), "workers": w}


def test_a_training_step_syncs_only_trainable_bytes():
    args = _scenario(lambda rng: 1)
    wire, gold_wire = Wire(), Wire()
    got = run(_DRIVER, args, oracle=wire)
    want = reference(_DRIVER, args, oracle=gold_wire)
    same(got, want)
    params, trainable = want["params"], want["trainable"]
    full = sum(np.asarray(v).nbytes for v in params.values())
    step = sum(np.asarray(params[k]).nbytes for k in trainable)
    assert 0 < step < full, "the probe needs frozen weights to tell a trainable-only sync apart"
    assert len(wire.sent) == 1 + args["steps"], f"{len(wire.sent)} messages, want 1 + one per step"
    assert sum(v.nbytes for v in wire.sent[0].values()) == full, "the first sync did not send every weight"
    assert wire.bytes == full + args["steps"] * step, \
        f"{wire.bytes} bytes after {args['steps']} steps, want {full} + {args['steps']} x {step} trainable bytes"
    for i, (m, g) in enumerate(zip(wire.sent, gold_wire.sent)):
        same(m, g, path=f"message {i}")


def test_every_rollout_worker_follows_the_actor():
    args = _scenario(lambda rng: int(rng.integers(2, 4)))
    got = run(_DRIVER, args, oracle=Wire())
    want = reference(_DRIVER, args, oracle=Wire())
    assert len(got["workers"]) == args["workers"], f"{len(got['workers'])} rollout workers, want {args['workers']}"
    same(got, want)
    for i, w in enumerate(want["workers"]):
        same(w, want["params"], path=f"gold's worker {i}")
