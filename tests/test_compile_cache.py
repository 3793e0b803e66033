"""torch_xla's persistent compilation cache as the setting XLA_PLUGINS_COMPILE_CACHE (compilation.compile_cache).

On PJRT CPU torch_xla writes executables but cannot read them back, so the plugin does not turn the cache on
there (one warning). With the test switch it does, and two runs in a row show what the plugin then reports:
torch_xla's own counters in the summary, and one warning that nothing could be read back. Each run is a
fresh interpreter (a process sets its cache up once) on real torch_xla.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xla_plugins.compilation import compile_cache

pytestmark = pytest.mark.xla

SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    import torch, lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel
    from xla_plugins.compilation import compile_cache

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = L.Trainer(accelerator="tpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[1])
        trainer.fit(BoringModel())
    monitor = next(c for c in trainer.callbacks if type(c).__name__ == "CompileMonitor")
    print(json.dumps({
        "cache_warnings": [str(w.message) for w in caught if issubclass(w.category, compile_cache.CompileCacheWarning)],
        "folder": compile_cache.enabled_folder(),
        "summary_cache": monitor.summary["persistent_cache"],
        "compilations": monitor.summary["compilations"],
    }))
    """
)


def fit(tmp_path: Path, folder: Path, **env: str) -> tuple[dict, str]:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PLUGINS_")}
    environ.update({"PJRT_DEVICE": "CPU", compile_cache.CACHE_VARIABLE: str(folder), **env})
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=environ, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_on_pjrt_cpu_the_cache_is_not_turned_on_and_one_warning_says_why(tmp_path):
    outcome, _ = fit(tmp_path, tmp_path / "cache")
    assert outcome["folder"] is None and outcome["summary_cache"] is None
    assert len(outcome["cache_warnings"]) == 1
    assert "not turned on for PJRT CPU" in outcome["cache_warnings"][0]
    assert "cannot read them back" in outcome["cache_warnings"][0]
    assert not (tmp_path / "cache").exists()  # nothing written


@pytest.mark.slow  # two fresh processes: primary tox cell only (tox.ini)
def test_where_executables_cannot_be_read_back_the_summary_counts_them_and_one_warning_says_so(tmp_path):
    folder = tmp_path / "cache"
    switch = {compile_cache.CPU_CACHE_TEST_SWITCH: "1"}
    first, first_err = fit(tmp_path, folder, **switch, XLA_PLUGINS_SUMMARY="tables")  # the cache's line is a table's
    assert first["folder"] == str(folder) and first["cache_warnings"] == []
    written = first["summary_cache"]["misses"]
    assert written >= 1 and first["summary_cache"]["unreadable"] == 0
    assert len(list(folder.iterdir())) == written  # one file per executable compiled in the run
    assert f"persistent compilation cache {folder}: 0 executable(s) read back, {written} compiled" in first_err

    second, _ = fit(tmp_path, folder, **switch)
    assert second["summary_cache"] == {"hits": 0, "misses": 0, "unreadable": written}
    assert second["compilations"] == first["compilations"]  # every graph compiled again
    assert len(second["cache_warnings"]) == 1
    assert f"held {written} executable(s)" in second["cache_warnings"][0] and "read none" in second["cache_warnings"][0]


def test_a_path_that_is_not_a_folder_is_a_value_error_naming_the_variable(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv(compile_cache.CACHE_VARIABLE, str(not_a_folder))
    with pytest.raises(ValueError, match=f"{compile_cache.CACHE_VARIABLE}=.*is not a folder"):
        compile_cache.configured_folder()
    monkeypatch.setenv(compile_cache.CACHE_VARIABLE, "  ")
    assert compile_cache.configured_folder() is None
