"""TorchTPU backend for PyTorch Lightning (trainer-plugins plugin).

Importing this package imports nothing else: torch's backend autoload imports
``torchtpu_plugins._autoload`` at every ``import torch``. The CPU-backed stand-in of the ``"tpu"``
device lives in :mod:`torchtpu_plugins.standin`.
"""
