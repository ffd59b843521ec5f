"""ONNX Runtime with the model's tokenizer in front: clients send text, not token ids.

A model of backend ``onnxruntime_text`` is an ONNX file taking ``input_ids`` and
``attention_mask`` (and ``token_type_ids`` when it wants them) with a ``tokenizer.json``
(Hugging Face ``tokenizers``) beside it in the version directory. It is served with one
BYTES input ``text`` of dims [1]: requests of any length batch together, and each batch
is tokenized in the instance's worker thread and padded to its own longest text, not to
the maximum. Texts are cut at ``parameters.max_sequence_length`` tokens (default: what
the tokenizer file says, else 512), as sentence-transformers does.

    name: "minilm"
    backend: "onnxruntime_text"
    max_batch_size: 32
    input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] } ]
    parameters { key: "max_sequence_length" value: { string_value: "256" } }
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tradeoff.backends import onnxruntime as ort_backend
from tradeoff.backends.base import Backend, TensorSpec
from tradeoff.backends.registry import InstanceSpec, TensorBackendType
from tradeoff.errors import ConfigError, InvalidInput, InvalidValue, ModelLoadError

__all__ = [
    "BACKEND",
    "MAX_TEXT_BYTES",
    "OPTIONAL_INPUTS",
    "TEXT_INPUT",
    "TOKENIZER_FILE",
    "TOKEN_INPUTS",
    "TextEncoderBackend",
    "check_text",
    "describe",
]

TEXT_INPUT = "text"
TOKENIZER_FILE = "tokenizer.json"
TOKEN_INPUTS = ("input_ids", "attention_mask")
OPTIONAL_INPUTS = ("token_type_ids",)
# the tokenizer reads a whole text before cutting it: bound what one element may cost
MAX_TEXT_BYTES = 1 << 20


def describe(model_path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The served tensors: ``text`` in, the ONNX file's outputs out."""
    inputs, outputs = ort_backend.describe(model_path)
    names = {i.name for i in inputs}
    missing = [n for n in TOKEN_INPUTS if n not in names]
    extra = sorted(names - set(TOKEN_INPUTS) - set(OPTIONAL_INPUTS))
    if missing or extra:
        raise ModelLoadError(
            f"{model_path}: an onnxruntime_text model takes {' and '.join(TOKEN_INPUTS)}"
            f" (and optionally {OPTIONAL_INPUTS[0]}); this one takes {sorted(names)}")
    if not (model_path.parent / TOKENIZER_FILE).is_file():
        raise ModelLoadError(f"{model_path.parent / TOKENIZER_FILE}: not found; an "
                             "onnxruntime_text model needs its tokenizer beside the model file")
    return [TensorSpec(TEXT_INPUT, "BYTES", (-1, 1))], outputs


def check_text(name: str, array: np.ndarray) -> None:
    """UTF-8 text of at most ``MAX_TEXT_BYTES`` per element."""
    lengths = np.fromiter((len(e) for e in array.reshape(-1)), dtype=np.int64,
                          count=array.size)
    if lengths.size and lengths.max() > MAX_TEXT_BYTES:
        index = int(lengths.argmax())
        raise InvalidInput(f"input {name!r}: text {index} is {int(lengths[index])} bytes; "
                           f"at most {MAX_TEXT_BYTES} per text (the model reads only its "
                           "first tokens: send the part you want embedded)")
    ort_backend.check_utf8(name, array)


class TextEncoderBackend(Backend):
    """Tokenize a batch of texts, run the ONNX model on the token ids."""

    def __init__(self, spec: InstanceSpec) -> None:
        from tokenizers import Tokenizer

        path = spec.path.parent / TOKENIZER_FILE
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own exception type
            raise ModelLoadError(f"{path}: not a readable tokenizer: {exc}") from None
        configured = self.tokenizer.truncation or {}
        raw = spec.parameters.get("max_sequence_length", configured.get("max_length", 512))
        try:
            self.max_length = int(raw)
            if self.max_length < 2:
                raise InvalidValue("must be at least 2")
        except ValueError as exc:
            raise ConfigError(f"model {spec.name!r}", "parameters.max_sequence_length",
                              f"{raw!r}: {exc}") from None
        padding = self.tokenizer.padding or {}
        self.tokenizer.enable_padding(pad_id=padding.get("pad_id", 0),
                                      pad_token=padding.get("pad_token", "[PAD]"))
        self.tokenizer.enable_truncation(self.max_length)
        self.model = ort_backend.OnnxRuntimeBackend(spec)
        self._type_ids = any(i.name == OPTIONAL_INPUTS[0]
                             for i in self.model.session.get_inputs())

    def tokenize(self, texts: np.ndarray) -> dict[str, np.ndarray]:
        """Token ids and attention mask of a batch of texts, padded to the longest."""
        strings = ort_backend.utf8_strings(TEXT_INPUT, texts.reshape(-1)).tolist()
        encodings = self.tokenizer.encode_batch(strings)
        feed = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings],
                                           dtype=np.int64)}
        if self._type_ids:
            feed[OPTIONAL_INPUTS[0]] = np.zeros_like(feed["input_ids"])
        return feed

    def run(self, inputs: Mapping[str, np.ndarray],
            output_names: Sequence[str]) -> dict[str, np.ndarray]:
        return self.model.run(self.tokenize(inputs[TEXT_INPUT]), output_names)

    def close(self) -> None:
        self.model.close()


BACKEND = TensorBackendType(name="onnxruntime_text", platforms=("onnxruntime_text",),
                            default_filename="model.onnx", describe=describe,
                            create=TextEncoderBackend, check_bytes=check_text)
