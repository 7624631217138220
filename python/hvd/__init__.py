"""hvd: collective-communication backends as run-time plugins, for data-parallel training.

`import hvd.torch as hvd` gives Horovod's PyTorch API over hvd (docs/python.md).
"""
from hvd.build_info import VERSION as __version__  # noqa: F401
