"""A rule reward: 1 for each response token equal to the target token, on the last token."""

import numpy as np


def token_level_rewards(data, target=3):
    r = data.batch["responses"]
    out = np.zeros(r.shape)
    out[:, -1] = (r == target).mean(axis=1)
    return out
