"""minitron: a small model-parallel training framework.

Ranks are simulated as processes (see ``minitron.comm``); layers are split across
tensor-parallel ranks and gradients are averaged across data-parallel ranks.
"""

__version__ = "0.3.0"
