"""A model on local disk loads without transformers' "Loading weights" bar, which on a terminal printed a
full-width bar under `sqlrl quickstart`'s progress line at every model load; the bar setting is restored.

Not covered: hub ids (they keep their download bars; no network in tests).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.utils import logging as hf_logging  # noqa: E402

from sqlrl.generation.models import load_model, no_loading_bar  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_models import tiny_model  # noqa: E402


def tiny_folder(path):
    model, tok = tiny_model()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_a_local_model_loads_without_the_loading_bar_and_the_setting_is_restored(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    folder = tiny_folder(tmp_path / "m")
    assert hf_logging.is_progress_bar_enabled()
    loaded = load_model(folder)
    err = capsys.readouterr().err
    assert loaded.identity.startswith("sha256:")
    assert "Loading weights" not in err, err
    assert hf_logging.is_progress_bar_enabled()


def test_no_loading_bar_keeps_a_bar_setting_the_user_turned_off():
    hf_logging.disable_progress_bar()
    try:
        with no_loading_bar():
            assert not hf_logging.is_progress_bar_enabled()
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
    with no_loading_bar(False):
        assert hf_logging.is_progress_bar_enabled()
    with pytest.raises(RuntimeError), no_loading_bar():
        raise RuntimeError("a failed load")
    assert hf_logging.is_progress_bar_enabled()
