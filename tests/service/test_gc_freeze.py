"""The garbage collector's permanent generation after warm-up (`--gc-freeze`, on by default): without it, every
full collection under load walks the model, the tokenizer and the libraries (a pause of ~0.1 s on the dev machine,
measured with gc.callbacks, `docs/benchmarks/2026-12-01-tuning-checklist.md`)."""

from __future__ import annotations

import gc
from pathlib import Path

from glassbox.service.app import create_app
from glassbox.service.settings import Settings
from tests.service.apptools import app_settings, ready_client


def test_the_default_freezes_what_is_alive_once_warm() -> None:
    assert Settings().gc_freeze is True


def test_a_warm_server_has_frozen_its_objects_and_still_serves(tiny_model_dir: Path) -> None:
    gc.unfreeze()
    try:
        with ready_client(create_app(app_settings(tiny_model_dir, gc_freeze=True))) as client:
            assert gc.get_freeze_count() > 10_000  # the app, the model and every module imported
            assert client.post("/v1/classify", json={"text": "good"}).status_code == 200
    finally:
        gc.unfreeze()


def test_no_freeze_when_switched_off(tiny_model_dir: Path) -> None:
    gc.unfreeze()
    with ready_client(create_app(app_settings(tiny_model_dir, gc_freeze=False))) as client:
        assert client.post("/v1/classify", json={"text": "good"}).status_code == 200
        assert gc.get_freeze_count() == 0
