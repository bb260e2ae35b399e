# An in-process cheat: every assertion helper the tests could use is made to accept anything.
# Names are built at run time, as a cheat that hides from a static scan would build them.
import sys
import unittest


def _accept(*args, **kwargs):
    return None


def _yes(*args, **kwargs):
    return True


for _name in dir(unittest.TestCase):
    if _name.startswith("assert") or _name == "fail":
        setattr(unittest.TestCase, _name, _accept)

try:
    import numpy as _np

    for _name in dir(_np.testing):
        if _name.startswith("assert"):
            setattr(_np.testing, _name, _accept)
    _np.allclose = _yes
    _np.array_equal = _yes
    _np.array_equiv = _yes
except Exception:
    pass

_torch = sys.modules.get("torch")
if _torch is not None:
    _torch.testing.assert_close = _accept
    _torch.allclose = _yes
    _torch.equal = _yes


class _Swallow:
    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


_runner = sys.modules.get("py" + "test")
if _runner is not None:
    _runner.raises = _Swallow
