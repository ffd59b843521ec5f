"""tritonclient.http.aio (the asyncio HTTP client) against `tradeoff serve`.

The synchronous tritonclient.http client is exercised across tests/integration."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http.aio as httpaio

from tests.integration.helpers import References
from tradeoff.server.process import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]


def test_asyncio_http_client(compat_server: ServerProcess,
                             compat_references: References) -> None:
    async def scenario() -> None:
        client = httpaio.InferenceServerClient(compat_server.url.removeprefix("http://"))
        try:
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready("mlp")
            metadata = await client.get_model_metadata("mlp")
            assert metadata["inputs"][0]["shape"] == [-1, 256]
            config = await client.get_model_config("mlp")
            assert config["max_batch_size"] == 64
            x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
            want = compat_references.run("mlp", {"INPUT0": x})["OUTPUT0"]
            requests = []
            for binary in (True, False, True, False):
                tensor = httpaio.InferInput("INPUT0", [2, 256], "FP32")
                tensor.set_data_from_numpy(x, binary_data=binary)
                output = httpaio.InferRequestedOutput("OUTPUT0", binary_data=binary)
                requests.append(client.infer("mlp", [tensor], outputs=[output]))
            for result in await asyncio.gather(*requests):
                np.testing.assert_allclose(result.as_numpy("OUTPUT0"), want,
                                           rtol=1e-5, atol=1e-5)
            stats = await client.get_inference_statistics("mlp")
            assert stats["model_stats"][0]["inference_count"] >= 8
            await client.unload_model("reloadable")
            assert not await client.is_model_ready("reloadable")
            await client.load_model("reloadable")
            assert await client.is_model_ready("reloadable")
        finally:
            await client.close()

    asyncio.run(scenario())
