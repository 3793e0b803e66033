"""TorchTPU as the plugin sees it, without ever starting the device: whether a TPU and torch-tpu are there.

* ``_probes``: availability and the device count, decided from torch-tpu's entry point and the PCI
  bus, bounded in time;
* ``_pci``: the TPU chips on the PCI bus (vendor ``0x1ae0``) and the host's topology;
* ``_torch_contract``: every private torch name the plugin (and its stand-in device) relies on.

Nothing here imports a role, a strategy or Lightning: the other folders build on this one.
"""
