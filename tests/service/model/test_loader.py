"""load_model on a good directory, and on every way a directory can be broken: one clear error each."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from glassbox.service.errors import ModelLoadError, UnsupportedArchitectureError
from glassbox.service.model.files import CONFIG_FILE, TOKENIZER_FILE, describe_model
from glassbox.service.model.loader import WEIGHTS_FILE, load_model, save_model
from glassbox.service.tokenizer import TextTokenizer
from tests.helpers import make_tiny_model_dir, tiny_tokenizer_json


def test_a_good_directory_loads(tiny_model_dir: Path) -> None:
    loaded = load_model(tiny_model_dir)
    assert loaded.path == tiny_model_dir and loaded.name == tiny_model_dir.name
    assert loaded.labels == ("negative", "positive", "neutral")
    assert loaded.tokenizer_file == tiny_model_dir / TOKENIZER_FILE
    assert not loaded.model.training
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in loaded.model.parameters())
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([[2, 5, 3]]), None)
    assert logits.shape == (1, 3) and torch.isfinite(logits).all()


def test_save_then_load_keeps_every_weight(tmp_path: Path, tiny_model_dir: Path) -> None:
    original = load_model(tiny_model_dir).model
    copy = load_model(save_model(tmp_path / "copy", original, tiny_tokenizer_json())).model
    for (name, a), (_, b) in zip(original.state_dict().items(), copy.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_half_precision_weights_load_as_fp32(tmp_path: Path) -> None:
    path = make_tiny_model_dir(tmp_path / "m")
    tensors = load_file(str(path / WEIGHTS_FILE))
    save_file({k: v.half() for k, v in tensors.items()}, str(path / WEIGHTS_FILE))
    model = load_model(path).model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.equal(model.pooler.weight, tensors["bert.pooler.dense.weight"].half().float())


def test_position_ids_buffer_from_older_checkpoints_is_ignored(tmp_path: Path) -> None:
    """Older transformers checkpoints carry `position_ids` as a saved buffer: it loads without complaint and changes
    nothing, neither the weights nor the logits."""
    path = make_tiny_model_dir(tmp_path / "m")
    before = load_model(path).model
    tensors = load_file(str(path / WEIGHTS_FILE))
    tensors["bert.embeddings.position_ids"] = torch.arange(128)[None]
    save_file(tensors, str(path / WEIGHTS_FILE))
    after = load_model(path).model
    assert before.state_dict().keys() == after.state_dict().keys()
    for name, value in before.state_dict().items():
        assert torch.equal(value, after.state_dict()[name]), name
    ids = torch.tensor([[2, 5, 7, 3]])  # [batch, seq]
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(before(ids, mask), after(ids, mask))


# --- broken directories -------------------------------------------------------------------------------------


def rewrite_config(path: Path, **changes: Any) -> None:
    raw = json.loads((path / CONFIG_FILE).read_text())
    for key, value in changes.items():
        if value is _DELETE:
            raw.pop(key, None)
        else:
            raw[key] = value
    (path / CONFIG_FILE).write_text(json.dumps(raw))


def rewrite_tensors(path: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(str(path / WEIGHTS_FILE))
    change(tensors)
    save_file(tensors, str(path / WEIGHTS_FILE))


def rewrite_template_id(path: Path, token: str, token_id: int) -> None:
    """Give a special token of tokenizer.json's post-processor its own id (one that get_vocab does not list)."""
    raw = json.loads((path / TOKENIZER_FILE).read_text())
    raw["post_processor"]["special_tokens"][token]["ids"] = [token_id]
    (path / TOKENIZER_FILE).write_text(json.dumps(raw))


def corrupt_bytes(path: Path, keep: Callable[[bytes], bytes]) -> None:
    path.write_bytes(keep(path.read_bytes()))


_DELETE = object()


def _drop(*keys: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(tensors: dict[str, torch.Tensor]) -> None:
        for key in keys:
            del tensors[key]

    return change


def _set(key: str, value: torch.Tensor) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda tensors: tensors.__setitem__(key, value)


def _poke(key: str, value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    """One value of one tensor replaced (a NaN or an infinity in an otherwise good checkpoint)."""
    return lambda tensors: tensors[key].view(-1).__setitem__(0, value)


def _overwrite_header(data: bytes) -> bytes:
    return data[:8] + b"!" * 16 + data[24:]


# (case id, damage, expected error type, file the message must name, words the message must contain)
DAMAGE: list[tuple[str, Callable[[Path], object], type[ModelLoadError], str, tuple[str, ...]]] = [
    ("no config", lambda p: (p / CONFIG_FILE).unlink(), ModelLoadError, CONFIG_FILE, ("missing",)),
    ("no weights", lambda p: (p / WEIGHTS_FILE).unlink(), ModelLoadError, WEIGHTS_FILE, ("missing",)),
    ("no tokenizer", lambda p: (p / TOKENIZER_FILE).unlink(), ModelLoadError, TOKENIZER_FILE, ("missing",)),
    ("config not json", lambda p: (p / CONFIG_FILE).write_text("{'hidden_size': 32,"), ModelLoadError,
     CONFIG_FILE, ("not readable JSON",)),
    ("config not an object", lambda p: (p / CONFIG_FILE).write_text("[1, 2]"), ModelLoadError, CONFIG_FILE,
     ("JSON object",)),
    ("config not utf-8", lambda p: (p / CONFIG_FILE).write_bytes(b"\xff\xfe{}"), ModelLoadError, CONFIG_FILE,
     ("not readable JSON",)),
    ("another family's weights",
     lambda p: rewrite_config(p, model_type="roberta", architectures=["RobertaForSequenceClassification"]),
     ModelLoadError, "does not match config.json",
     ("missing tensors: classifier.dense.bias", "unknown tensors: bert.")),
    ("unsupported family", lambda p: rewrite_config(p, model_type="deberta-v2",
                                                    architectures=["DebertaV2ForSequenceClassification"]),
     UnsupportedArchitectureError, CONFIG_FILE, ("deberta-v2", "not supported", "bert, distilbert", "electra")),
    ("gpt2", lambda p: rewrite_config(p, model_type="gpt2", architectures=["GPT2ForSequenceClassification"]),
     UnsupportedArchitectureError, CONFIG_FILE, ("gpt2", "not supported", "MiniLM")),
    ("heads", lambda p: rewrite_config(p, num_attention_heads=5), ModelLoadError, CONFIG_FILE,
     ("not divisible by num_attention_heads 5",)),
    # no id2label: transformers' 2 default labels, which a 3-output head does not match (num_labels would say 3)
    ("no id2label", lambda p: rewrite_config(p, id2label=_DELETE, label2id=_DELETE), ModelLoadError,
     "does not match config.json", ("id2label names 2 labels", "classifier.weight is (3, 32), expected (2, 32)")),
    ("fewer labels than the head", lambda p: rewrite_config(p, id2label={"0": "neg", "1": "pos"}), ModelLoadError,
     "does not match config.json", ("id2label names 2 labels", "classifier.weight is (3, 32), expected (2, 32)")),
    ("more labels than the head", lambda p: rewrite_config(p, id2label={str(i): f"l{i}" for i in range(4)}),
     ModelLoadError, "does not match config.json", ("id2label names 4 labels",)),
    ("hidden size differs", lambda p: rewrite_config(p, hidden_size=64, num_attention_heads=4), ModelLoadError,
     "does not match config.json", ("wrong shapes", "expected")),
    ("wrong shape", lambda p: rewrite_tensors(p, _set("bert.encoder.layer.1.output.dense.weight", torch.zeros(32, 63))),
     ModelLoadError, "does not match config.json", ("wrong shapes", "encoder.layer.1.output.dense.weight is (32, 63)")),
    ("unknown key", lambda p: rewrite_tensors(p, _set("cls.predictions.decoder.weight", torch.zeros(4))),
     ModelLoadError, "does not match config.json", ("unknown tensors: cls.predictions.decoder.weight",)),
    ("extra layer", lambda p: rewrite_config(p, num_hidden_layers=3), ModelLoadError, "does not match config.json",
     ("missing tensors", "encoder.layer.2.")),
    ("missing tensor", lambda p: rewrite_tensors(p, _drop("bert.encoder.layer.0.attention.self.key.bias")),
     ModelLoadError, "does not match config.json", ("missing tensors: encoder.layer.0.attention.self.key.bias",)),
    ("missing head", lambda p: rewrite_tensors(p, _drop("classifier.weight", "classifier.bias")),
     ModelLoadError, "does not match config.json", ("missing tensors: classifier.bias, classifier.weight",)),
    ("truncated weights", lambda p: corrupt_bytes(p / WEIGHTS_FILE, lambda b: b[: len(b) // 2]), ModelLoadError,
     WEIGHTS_FILE, ("not a readable safetensors file",)),
    ("garbage weights", lambda p: (p / WEIGHTS_FILE).write_bytes(b"PK\x03\x04 this is a zip file"), ModelLoadError,
     WEIGHTS_FILE, ("not a readable safetensors file",)),
    ("empty weights", lambda p: (p / WEIGHTS_FILE).write_bytes(b""), ModelLoadError, WEIGHTS_FILE,
     ("not a readable safetensors file",)),
    ("bad safetensors header", lambda p: corrupt_bytes(p / WEIGHTS_FILE, _overwrite_header), ModelLoadError,
     WEIGHTS_FILE, ("not a readable safetensors file",)),
    ("tokenizer not json", lambda p: (p / TOKENIZER_FILE).write_text('{"model": '), ModelLoadError, TOKENIZER_FILE,
     ("not a readable tokenizer.json",)),
    ("tokenizer without model", lambda p: (p / TOKENIZER_FILE).write_text('{"version": "1.0"}'), ModelLoadError,
     TOKENIZER_FILE, ("not a readable tokenizer.json",)),
    ("tokenizer bigger than the embeddings", lambda p: rewrite_config(p, vocab_size=50), ModelLoadError,
     TOKENIZER_FILE, ("vocab_size is 50", "does not belong")),
    ("infinite layer_norm_eps", lambda p: rewrite_config(p, layer_norm_eps=float("inf")), ModelLoadError, CONFIG_FILE,
     ("'layer_norm_eps' must be a positive number (found inf)",)),
    ("NaN in the weights", lambda p: rewrite_tensors(p, _poke("classifier.weight", float("nan"))), ModelLoadError,
     WEIGHTS_FILE, ("classifier.weight", "not finite")),
    ("infinity in the weights",
     lambda p: rewrite_tensors(p, _poke("bert.embeddings.word_embeddings.weight", float("-inf"))), ModelLoadError,
     WEIGHTS_FILE, ("bert.embeddings.word_embeddings.weight", "not finite")),
    ("integer weights", lambda p: rewrite_tensors(p, _set("classifier.weight", torch.ones(3, 32, dtype=torch.int32))),
     ModelLoadError, "does not match config.json", ("not floating point: classifier.weight (torch.int32)",)),
    ("tokenizer template token beyond the embeddings", lambda p: rewrite_template_id(p, "[SEP]", 500),
     ModelLoadError, TOKENIZER_FILE, ("token id 500 ('[SEP]')", "vocab_size is 108", "does not belong")),
]


@pytest.mark.parametrize("damage, kind, names, words", [c[1:] for c in DAMAGE], ids=[c[0] for c in DAMAGE])
def test_broken_directory_fails_with_one_clear_error(
    tmp_path: Path, damage: Callable[[Path], object], kind: type[ModelLoadError], names: str, words: tuple[str, ...]
) -> None:
    path = make_tiny_model_dir(tmp_path / "model")
    damage(path)
    with pytest.raises(ModelLoadError) as caught:
        load_model(path)
    error = caught.value
    assert type(error) is kind
    message = str(error)
    assert str(path) in message, message  # names the directory or the file in it
    assert names in message, message
    for word in words:
        assert word in message, message
    # One line, no chained torch/safetensors exception: the message is all the operator sees.
    assert "\n" not in message and "Traceback" not in message
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"model directory .*nowhere does not exist"):
        load_model(tmp_path / "nowhere")


def test_a_file_is_not_a_model_directory(tmp_path: Path) -> None:
    (tmp_path / "model").write_text("")
    # it exists: 'does not exist' sent the operator looking for the wrong mistake
    with pytest.raises(ModelLoadError, match=r"model directory .*model is not a directory"):
        load_model(tmp_path / "model")


def test_an_unreadable_directory_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory its user may not search (mode 000 for a user other than root): every stat of a file in it fails
    with EACCES, which pathlib's is_file does not swallow. As root the mode bits do not apply, so stat is made to
    fail as the kernel would."""
    path = make_tiny_model_dir(tmp_path / "model")
    stat = Path.stat

    def denied(self: Path, *, follow_symlinks: bool = True) -> os.stat_result:
        if self.parent == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return stat(self, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(Path, "stat", denied)
    with pytest.raises(ModelLoadError, match=r"model directory .*model cannot be read: permission denied"):
        load_model(path)
    with pytest.raises(ModelLoadError, match=r"model directory .*model cannot be read: permission denied"):
        describe_model(path)


def test_tokenizer_of_a_loaded_model_encodes(tiny_model_dir: Path) -> None:
    loaded = load_model(tiny_model_dir)
    tokenizer = TextTokenizer.from_file(loaded.tokenizer_file, 256, loaded.config.max_position_embeddings)
    assert tokenizer.max_length == 128
    batch = tokenizer.encode(["good movie"])
    assert int(batch.ids.max()) < loaded.config.vocab_size
