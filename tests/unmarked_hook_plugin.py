"""A plugin hook module whose author forgot ``@hookimpl`` on one hook (for the conformance kit's own test)."""

from trainer_plugins import AcceleratorEntry, hookimpl

TRAINER_PLUGINS_API = ">=1.0,<2"


@hookimpl
def trainer_plugins_accelerators():
    return [AcceleratorEntry("unmarked_npu", trainer="lightning.pytorch.accelerators:CPUAccelerator")]


def trainer_plugins_accelerator_available(name):  # no @hookimpl: pluggy never calls it
    return True if name == "unmarked_npu" else None
