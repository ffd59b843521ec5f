"""An MLServer runtime that runs an ONNX file with ONNX Runtime (one intra-op thread): the
peer of benchmarks/peers.py, which writes the repository and puts this folder on
``PYTHONPATH``. Each model's ``model-settings.json`` names it:

    {"name": "mlp", "implementation": "mlserver_runtime.OnnxModel",
     "parameters": {"uri": "/path/to/model.onnx"}, "inputs": [...], "outputs": [...]}

MLServer has neither the model configuration nor the statistics extension, and
perf_analyzer will not start without both; two custom handlers add them. The
configuration is Triton's, read from the ONNX file. The statistics count what this
runtime sees: ``success`` is the time inside ``predict``, ``compute_infer`` the time in
ONNX Runtime; MLServer's own queueing and (de)serialisation are not in them.
"""

import time

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.handlers import custom_handler
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

MAX_BATCH_SIZE = 256  # what the config says: MLServer takes any batch
STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
# The loaded models by name: MLServer routes a custom handler's path to the first model
# that declares it, for every model name, so the handlers look the model up here. MLServer
# also reloads this module for each model naming it (mlserver/settings.py,
# _reload_module); a reload keeps the module's globals, so the registry is made once.
LOADED: dict[str, "OnnxModel"] = globals().get("LOADED", {})


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(self.settings.parameters.uri, options,
                                            providers=["CPUExecutionProvider"])
        (self.source,), (self.sink,) = self.session.get_inputs(), self.session.get_outputs()
        self.counts = {stage: {"count": 0, "ns": 0} for stage in STAGES}
        LOADED[self.name] = self
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        start = time.perf_counter_ns()
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        run_start = time.perf_counter_ns()
        (y,) = self.session.run([self.sink.name], {self.source.name: x})
        end = time.perf_counter_ns()
        # a plain output, without "parameters": perf_analyzer's JSON output parser fails on
        # a parameters object lacking binary_data_size
        response = InferenceResponse(model_name=self.name, outputs=[ResponseOutput(
            name=self.sink.name, shape=list(y.shape), datatype="FP32",
            data=y.ravel().tolist())])
        self._count("compute_infer", end - run_start)
        self._count("success", time.perf_counter_ns() - start)
        return response

    def _count(self, stage: str, ns: int) -> None:
        self.counts[stage]["count"] += 1
        self.counts[stage]["ns"] += ns

    @custom_handler(rest_path="/v2/models/{model_name}/config", rest_method="GET")
    async def triton_config(self, model_name: str) -> dict:
        model = LOADED[model_name]

        def tensor(arg: ort.NodeArg) -> dict:
            return {"name": arg.name, "data_type": "TYPE_FP32", "dims": list(arg.shape[1:])}

        return {"name": model_name, "platform": "onnxruntime_onnx",
                "max_batch_size": MAX_BATCH_SIZE, "input": [tensor(model.source)],
                "output": [tensor(model.sink)]}

    @custom_handler(rest_path="/v2/models/{model_name}/stats", rest_method="GET")
    async def triton_stats(self, model_name: str) -> dict:
        counts = LOADED[model_name].counts
        served = counts["success"]["count"]
        return {"model_stats": [{
            "name": model_name, "version": "1", "last_inference": 0,
            "inference_count": served, "execution_count": served,
            "inference_stats": {stage: dict(c) for stage, c in counts.items()},
            "batch_stats": []}]}
