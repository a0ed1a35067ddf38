# SPDX-License-Identifier: Apache-2.0
"""vLLM's general plugins: every entry point of the group
vllm.general_plugins (those named in $VLLM_PLUGINS, when set) is loaded and
called, once per process."""
import os
from importlib.metadata import entry_points

from vllm.logger import init_logger

logger = init_logger(__name__)

DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
plugins_loaded = False


def load_plugins_by_group(group):
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed = None if allowed is None else allowed.split(",")
    plugins = {}
    for plugin in entry_points(group=group):
        if allowed is None or plugin.name in allowed:
            try:
                plugins[plugin.name] = plugin.load()
            except Exception:
                logger.exception("Failed to load plugin %s", plugin.name)
    return plugins


def load_general_plugins():
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
        func()
