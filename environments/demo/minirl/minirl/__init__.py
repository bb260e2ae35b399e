"""minirl: rollout, weight sync, advantages and PPO updates for a token policy."""
