"""Both plugins of this repository pass the conformance kit that trainer-plugins ships to plugin authors."""

from trainer_plugins.testing import PluginConformance


class TestXLAPlugin(PluginConformance):
    plugin = "xla"


class TestLocalSGDExamplePlugin(PluginConformance):
    plugin = "localsgd"
