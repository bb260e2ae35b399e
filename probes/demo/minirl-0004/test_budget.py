"""Budget probe for minirl-0004: run alone, so the harness's cgroup peak is this test's.

The judge (this module) never imports minirl: the code under test runs in a child process
(whose memory counts) on weights and a batch the judge draws fresh, and sends back the updated
head, which the judge checks against the clipped-PPO step it computes itself, a few rows at a
time so that its own memory stays small beside the child's."""

import numpy as np

from infradev_probe import fresh, run

LR, CLIP = 5.0, 0.2


def _step(embed, head, batch, rows=4):
    p, r = batch["prompts"], batch["responses"]
    adv, old = batch["advantages"], batch["old_log_probs"]
    grad = np.zeros_like(head)
    for lo in range(0, len(p), rows):
        sl = slice(lo, lo + rows)
        h = embed[np.concatenate([p[sl, None], r[sl, :-1]], axis=1)]
        z = h @ head
        z = z - z.max(axis=-1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        ratio = np.exp(np.take_along_axis(lp, r[sl, :, None], axis=-1)[..., 0] - old[sl])
        active = np.where(adv[sl] >= 0, ratio <= 1 + CLIP, ratio >= 1 - CLIP)
        coef = ratio * adv[sl] * active / adv.size
        g = -np.exp(lp) * coef[..., None]
        np.put_along_axis(g, r[sl, :, None], np.take_along_axis(g, r[sl, :, None], axis=-1) + coef[..., None], axis=-1)
        grad += np.einsum("btd,btv->dv", h, g)
    return head + LR * grad


def test_micro_batched_update_with_a_large_vocabulary():
    rng = fresh()
    vocab, b, t, dim = int(rng.integers(18000, 22000)), 64, 8, 8
    embed, head = rng.standard_normal((vocab, dim)), rng.standard_normal((dim, vocab)) * 0.3
    batch = {"prompts": rng.integers(0, vocab, b), "responses": rng.integers(0, vocab, (b, t)),
             "advantages": rng.standard_normal((b, t)), "old_log_probs": -rng.random((b, t)) * 10}
    out = run("""
        from minirl.actor import Actor
        from minirl.policy import Policy
        from minirl.protocol import DataProto

        policy = Policy(vocab_size=ARGS["vocab"], dim=ARGS["dim"], seed=0)
        policy.params["embed"][...] = ARGS["embed"]
        policy.params["head"][...] = ARGS["head"]
        actor = Actor(policy)
        actor.update_policy(DataProto(dict(ARGS["batch"])), micro_batch_size=4)
        emit(after=actor.policy.params["head"])
    """, {"vocab": vocab, "dim": dim, "embed": embed, "head": head, "batch": batch})
    np.testing.assert_allclose(out["after"], _step(embed, head, batch), rtol=1e-7, atol=1e-10,
                               err_msg="the micro-batched update is not the clipped-PPO step")
