"""Probes for minirl-0004 (micro-batched PPO updates).

The judge (this module) never imports minirl: each probe drives the code under test in a child
process and checks the plain data it sends back against a full-batch step computed here."""

import numpy as np

from infradev_probe import fresh, run

# The actor's defaults: Actor(policy) steps with lr 5.0 and clips ratios at 1 +- 0.2.
LR, CLIP = 5.0, 0.2


def _log_softmax(x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _full_batch_step(embed, head, batch):
    """The clipped-PPO step over the whole batch, averaged over every token: (new head, objective)."""
    p, r = batch["prompts"], batch["responses"]
    adv, old = batch["advantages"], batch["old_log_probs"]
    h = embed[np.concatenate([p[:, None], r[:, :-1]], axis=1)]  # (B, T, D)
    lp = _log_softmax(h @ head)  # (B, T, V)
    ratio = np.exp(np.take_along_axis(lp, r[..., None], axis=-1)[..., 0] - old)
    active = np.where(adv >= 0, ratio <= 1 + CLIP, ratio >= 1 - CLIP)
    coef = ratio * adv * active / adv.size
    onehot = np.zeros_like(lp)
    np.put_along_axis(onehot, r[..., None], 1.0, axis=-1)
    grad = np.einsum("btd,btv->dv", h, (onehot - np.exp(lp)) * coef[..., None])
    objective = np.minimum(ratio * adv, np.clip(ratio, 1 - CLIP, 1 + CLIP) * adv).mean()
    return head + LR * grad, float(objective)


def test_an_uneven_last_micro_batch_still_gives_the_full_step():
    # Fresh weights and a fresh batch whose size the micro-batch does not divide.
    rng = fresh()
    vocab, dim, micro = int(rng.integers(8, 24)), int(rng.integers(4, 10)), int(rng.integers(2, 4))
    b = micro * int(rng.integers(1, 4)) + int(rng.integers(1, micro))
    t = int(rng.integers(2, 5))
    embed, head = rng.standard_normal((vocab, dim)), rng.standard_normal((dim, vocab)) * 0.3
    batch = {"prompts": rng.integers(0, vocab, b), "responses": rng.integers(0, vocab, (b, t)),
             "advantages": rng.standard_normal((b, t)), "old_log_probs": -rng.random((b, t)) * 3}
    out = run("""
        from minirl.actor import Actor
        from minirl.policy import Policy
        from minirl.protocol import DataProto

        def actor():
            policy = Policy(vocab_size=ARGS["vocab"], dim=ARGS["dim"], seed=0)
            policy.params["embed"][...] = ARGS["embed"]
            policy.params["head"][...] = ARGS["head"]
            return Actor(policy)

        full, micro = actor(), actor()
        full_obj = full.update_policy(DataProto(dict(ARGS["batch"])))
        micro_obj = micro.update_policy(DataProto(dict(ARGS["batch"])), micro_batch_size=ARGS["micro"])
        emit(full_head=full.policy.params["head"], micro_head=micro.policy.params["head"],
             full_obj=float(full_obj), micro_obj=float(micro_obj))
    """, {"batch": batch, "vocab": vocab, "dim": dim, "embed": embed, "head": head, "micro": micro})
    want_head, want_obj = _full_batch_step(embed, head, batch)
    np.testing.assert_allclose(out["full_head"], want_head, rtol=1e-9, atol=1e-12,
                               err_msg="the full-batch step is not the clipped-PPO step")
    np.testing.assert_allclose(out["micro_head"], want_head, rtol=1e-9, atol=1e-12,
                               err_msg=f"micro-batches of {micro} rows step differently from the full batch")
    np.testing.assert_allclose([out["full_obj"], out["micro_obj"]], [want_obj, want_obj], rtol=1e-9, atol=1e-12,
                               err_msg="the returned objective")
