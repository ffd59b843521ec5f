"""Fill in what a config leaves out from the model file itself, as Triton does.

* No inputs/outputs in the config: take them from the model.
* No ``max_batch_size``: if every input and output has a variable first dimension the
  model can batch, so ``max_batch_size`` becomes the server's default (4) and, when that
  is above 1 and no scheduler is configured, ``dynamic_batching {}`` is turned on.
* Inputs/outputs the config does give are checked against the model: names, datatypes
  and fixed dimensions must agree. A PyTorch model's may be named ``<anything>__<i>``,
  its i-th input or output (Triton's rule for TorchScript and exported programs).
"""

from __future__ import annotations

import re

from tradeoff.backends.base import TensorSpec
from tradeoff.errors import ConfigError
from tradeoff.repository.config import DynamicBatching, ModelConfig, TensorConfig

__all__ = ["POSITIONAL_PLATFORMS", "autocomplete"]


def _can_batch(specs: list[TensorSpec]) -> bool:
    return bool(specs) and all(len(s.shape) >= 1 and s.shape[0] == -1 for s in specs)


def _check(declared: TensorConfig, spec: TensorSpec, batch_dim: bool, source: str,
           where: str) -> None:
    if declared.datatype != spec.datatype:
        raise ConfigError(source, f"{where}.data_type",
                          f"{declared.datatype} does not match the model's {spec.datatype}")
    model_dims = spec.shape[1:] if batch_dim else spec.shape
    dims = declared.reshape if declared.reshape is not None else declared.dims
    dims_field = "reshape.shape" if declared.reshape is not None else "dims"
    if len(dims) != len(model_dims):
        raise ConfigError(source, f"{where}.{dims_field}",
                          f"{list(dims)} has rank {len(dims)} but the model's tensor "
                          f"{spec.name!r} is {list(model_dims)} (batch dim excluded)"
                          if batch_dim else
                          f"{list(dims)} has rank {len(dims)} but the model's tensor "
                          f"{spec.name!r} is {list(model_dims)}")
    for i, (d, m) in enumerate(zip(dims, model_dims, strict=True)):
        if m != -1 and d != -1 and d != m:
            raise ConfigError(source, f"{where}.{dims_field}[{i}]",
                              f"{d} does not match the model's fixed size {m}")


_INDEXED = re.compile(r"^.*__(\d+)$")
POSITIONAL_PLATFORMS = ("pytorch_libtorch", "torch_export")


def _positions(config: ModelConfig, declared: tuple[TensorConfig, ...],
               specs: list[TensorSpec]) -> list[int] | None:
    """Triton's PyTorch rule: where every name of the config's inputs (or outputs) is
    ``<anything>__<i>`` and none is the model's own name, the i-th of the model's; else
    None (bound by name)."""
    if config.platform not in POSITIONAL_PLATFORMS or not declared:
        return None
    own = {s.name for s in specs}
    found = [_INDEXED.match(t.name) for t in declared]
    if not all(found) or any(t.name in own for t in declared):
        return None
    places = [int(m.group(1)) for m in found if m]
    return places if all(p < len(specs) for p in places) else None


def autocomplete(config: ModelConfig, declared: tuple[list[TensorSpec], list[TensorSpec]] | None,
                 *, source: str, default_max_batch_size: int = 4) -> ModelConfig:
    """The effective config: ``config`` completed and checked against the model's tensors
    (``declared``: inputs and outputs, or None for a file that does not say them, whose
    config must list them and gets no max_batch_size it did not give)."""
    if declared is None:
        for kind, tensors in (("input", config.inputs), ("output", config.outputs)):
            if not tensors:
                raise ConfigError(source, kind, f"this {config.platform} model file does not "
                                  f"say its tensors: list every {kind} (name, data_type, "
                                  "dims) in the config")
        return config
    inputs, outputs = declared
    can_batch = _can_batch(inputs + outputs)
    max_batch = config.max_batch_size
    enable_batcher = False
    if not config.max_batch_size_given:
        max_batch = default_max_batch_size if can_batch else 0
        enable_batcher = max_batch > 1 and config.dynamic_batching is None
    elif max_batch > 0 and not can_batch:
        fixed = [s.name for s in inputs + outputs if not s.shape or s.shape[0] != -1]
        raise ConfigError(source, "max_batch_size",
                          f"is {max_batch} but the model's tensors {fixed} have no variable "
                          "first (batch) dimension; set max_batch_size: 0")
    batch_dim = max_batch > 0

    def complete(declared: tuple[TensorConfig, ...], specs: list[TensorSpec],
                 kind: str) -> tuple[TensorConfig, ...]:
        by_name = {s.name: s for s in specs}
        if not declared:
            return tuple(TensorConfig(s.name, s.datatype,
                                      tuple(s.shape[1:] if batch_dim else s.shape))
                         for s in specs)
        places = _positions(config, declared, specs)
        for i, t in enumerate(declared):
            spec = specs[places[i]] if places is not None else by_name.get(t.name)
            if spec is None:
                raise ConfigError(source, f"{kind}[{i}].name",
                                  f"{t.name!r} is not an {kind} of the model "
                                  f"(it has: {', '.join(sorted(by_name))}; a PyTorch model "
                                  f"also binds {kind.upper()}__0, {kind.upper()}__1, ... "
                                  "by position)")
            _check(t, spec, batch_dim, source, f"{kind}[{i}]")
        return declared

    new_inputs = complete(config.inputs, inputs, "input")
    new_outputs = complete(config.outputs, outputs, "output")
    places = _positions(config, new_inputs, inputs)
    declared_names = {inputs[p].name for p in places} if places is not None else \
        {t.name for t in new_inputs}
    missing = [s.name for s in inputs if s.name not in declared_names]
    if missing:
        raise ConfigError(source, "input", f"the model needs inputs {missing} that the config "
                          "does not declare")
    return config.with_changes(
        max_batch_size=max_batch,
        inputs=new_inputs,
        outputs=new_outputs,
        dynamic_batching=DynamicBatching() if enable_batcher else config.dynamic_batching,
    )
