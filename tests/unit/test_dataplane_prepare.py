"""The checks of a decoded request against a model (server/validation.py), and what they
remember of request headers found valid."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from tests.synthetic_model import write_synthetic_model
from tradeoff.errors import InvalidInput
from tradeoff.protocol.v2 import decode_request
from tradeoff.repository.repository import ModelRepository
from tradeoff.server.dataplane import DataPlane
from tradeoff.server.models import ModelManager
from tradeoff.server.validation import validate


def binary_body(name: str, array: np.ndarray) -> tuple[bytes, int]:
    header = json.dumps({"inputs": [{"name": name, "datatype": "FP32",
                                     "shape": list(array.shape),
                                     "parameters": {"binary_data_size": array.nbytes}}]})
    return header.encode() + array.tobytes(), len(header)


def test_a_header_valid_for_one_model_is_still_checked_for_another(tmp_path: Path) -> None:
    write_synthetic_model(tmp_path, "four", fixed_ms=0, per_row_ms=0, width=4)
    write_synthetic_model(tmp_path, "eight", fixed_ms=0, per_row_ms=0, width=8)

    async def scenario() -> None:
        manager = ModelManager(ModelRepository(tmp_path))
        await manager.load("four")
        await manager.load("eight")
        dataplane = DataPlane(manager)
        try:
            body, length = binary_body("INPUT0", np.ones((2, 4), np.float32))
            for _ in range(3):  # checked once, then known for "four"
                request = decode_request(body, length)
                served = manager.tensor("four", None)
                internal = validate(served, request)
                assert internal.rows == 2
                assert list(internal.inputs) == ["INPUT0"]
                assert internal.inputs["INPUT0"] is request.inputs[0].array
            assert request.header in served.checked
            for _ in range(2):  # the same header, a model it does not fit: refused each time
                with pytest.raises(InvalidInput, match="does not match"):
                    validate(manager.tensor("eight", None), decode_request(body, length))
            assert not manager.tensor("eight", None).checked
            _, _, outputs = await dataplane.infer("four", None, decode_request(body, length))
            np.testing.assert_array_equal(outputs[0].array, np.ones((2, 4), np.float32))
        finally:
            await manager.close()

    asyncio.run(scenario())
