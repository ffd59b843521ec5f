"""The paged-cache Llama decoder against Hugging Face transformers on the same random
weights: same logits within tolerance, same greedy tokens, and the same tokens whether a
sequence runs alone or batched with others."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tradeoff.backends.llama import LlamaConfig, LlamaDecoder, SequenceStep  # noqa: E402

CONFIG = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_layers=2,
                     num_heads=4, num_kv_heads=2, rope_theta=10000.0, max_position=128,
                     bos_token_id=1, eos_token_id=2)
BLOCK = 4


@pytest.fixture(scope="module")
def models() -> tuple:
    transformers = pytest.importorskip("transformers")  # 1.2 s: here, not at collection
    torch.manual_seed(7)
    hf_config = transformers.LlamaConfig(**{k: v for k, v in CONFIG.to_hf().items()
                                            if k not in ("architectures", "model_type")})
    reference = transformers.LlamaForCausalLM(hf_config).eval()
    for parameter in reference.parameters():  # norms start at 1: make them matter too
        torch.nn.init.normal_(parameter, std=0.2)
    return reference, LlamaDecoder(CONFIG, reference.state_dict())


def slots_for(blocks: list[int], length: int) -> torch.Tensor:
    table = torch.tensor(blocks, dtype=torch.int64)
    slots = (table[:, None] * BLOCK + torch.arange(BLOCK)[None, :]).reshape(-1)
    return slots[:length]


def test_logits_match_transformers(models: tuple) -> None:
    reference, decoder = models
    prompt = torch.tensor([1, 5, 9, 33, 70, 4, 8, 15, 16, 23, 42], dtype=torch.int64)
    with torch.no_grad():
        expected = reference(prompt[None]).logits[0]
    cache = decoder.new_cache(num_blocks=8, block_size=BLOCK)
    ours = decoder.step([SequenceStep(prompt, 0, slots_for([3, 0, 5], len(prompt)))], cache,
                        all_logits=True)[0]
    assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4), (ours - expected).abs().max()


def greedy(decoder: LlamaDecoder, prompts: list[list[int]], new_tokens: int,
           chunk: int | None = None) -> list[list[int]]:
    """Greedy decoding of several prompts batched together in every step; a prompt
    longer than ``chunk`` is prefilled in chunks."""
    cache = decoder.new_cache(num_blocks=64, block_size=BLOCK)
    tables = [list(range(i * 16, i * 16 + 16)) for i in range(len(prompts))]
    done = [0] * len(prompts)
    outputs: list[list[int]] = [[] for _ in prompts]
    sequences = [list(p) for p in prompts]
    while any(len(o) < new_tokens for o in outputs):
        steps, owners = [], []
        for i, seq in enumerate(sequences):
            if len(outputs[i]) >= new_tokens:
                continue
            end = len(seq) if chunk is None else min(len(seq), done[i] + chunk)
            tokens = torch.tensor(seq[done[i]:end], dtype=torch.int64)
            steps.append(SequenceStep(tokens, done[i], slots_for(tables[i], end)))
            owners.append((i, end))
        logits = decoder.step(steps, cache)
        for (i, end), row in zip(owners, logits, strict=True):
            done[i] = end
            if end == len(sequences[i]):  # the whole prompt (or last token) is in
                token = int(row.argmax())
                outputs[i].append(token)
                sequences[i].append(token)
    return outputs


def test_greedy_tokens_match_transformers(models: tuple) -> None:
    reference, decoder = models
    prompt = [1, 17, 4, 60, 22]
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=10,
                                      do_sample=False, eos_token_id=None,
                                      pad_token_id=0)[0, len(prompt):].tolist()
    assert greedy(decoder, [prompt], 10) == [expected]


def test_alone_or_batched_or_chunked_the_greedy_tokens_are_the_same(models: tuple) -> None:
    _, decoder = models
    prompts = [[1, 17, 4, 60, 22], [1, 90, 3], [1, 8, 8, 8, 8, 8, 8, 8, 8, 31, 12]]
    alone = [greedy(decoder, [p], 8)[0] for p in prompts]
    assert greedy(decoder, prompts, 8) == alone
    assert greedy(decoder, prompts, 8, chunk=3) == alone


def test_a_step_that_mixes_decodes_and_a_prompt_chunk_gives_each_its_logits_alone(
        models: tuple) -> None:
    _, decoder = models
    cache = decoder.new_cache(num_blocks=64, block_size=BLOCK)
    prompts = [[1, 17, 4, 60, 22, 9, 9], [1, 90, 3], [1, 8, 8, 8, 8, 8, 8, 8, 8, 31]]
    tables = [[5, 1, 9], [0, 7], [2, 3, 4]]
    decoder.step([SequenceStep(torch.tensor(p), 0, slots_for(t, len(p)))
                  for p, t in zip(prompts[:2], tables[:2], strict=True)], cache)
    # two sequences decode (different lengths, so the batch is padded), one prefills
    steps = [SequenceStep(torch.tensor([7]), len(prompts[0]), slots_for(tables[0], 8)),
             SequenceStep(torch.tensor(prompts[2]), 0, slots_for(tables[2], len(prompts[2]))),
             SequenceStep(torch.tensor([5]), len(prompts[1]), slots_for(tables[1], 4))]
    together = decoder.step(steps, cache)
    for step, expected in zip(steps, together, strict=True):
        (alone,) = decoder.step([step], cache)
        assert torch.allclose(alone, expected, atol=1e-4, rtol=1e-4)


def test_aten_and_onednn_matmuls_give_the_same_logits(models: tuple) -> None:
    reference, decoder = models
    aten = LlamaDecoder(CONFIG, reference.state_dict(), onednn=False)
    assert not aten.onednn
    tokens = torch.tensor([1, 5, 9, 13, 40, 41, 42, 7])
    logits = []
    for model in (decoder, aten):
        cache = model.new_cache(num_blocks=4, block_size=BLOCK)
        logits += model.step([SequenceStep(tokens, 0, torch.arange(8))], cache,
                             all_logits=True)
    assert torch.allclose(logits[0], logits[1], atol=1e-4, rtol=1e-4)


def test_the_hugging_face_state_dict_gives_back_the_weights(models: tuple) -> None:
    reference, decoder = models
    expected = reference.state_dict()
    ours = decoder.hf_state_dict()
    assert set(ours) == set(expected)
    assert all(torch.equal(ours[name], expected[name]) for name in expected)
    with pytest.raises(ValueError, match="int8"):
        LlamaDecoder(CONFIG, expected, precision="int8").hf_state_dict()


def test_config_from_hugging_face_json() -> None:
    doc = CONFIG.to_hf()
    assert LlamaConfig.from_hf(doc) == CONFIG
    assert LlamaConfig.from_hf({**doc, "eos_token_id": [2, 3]}).eos_token_id == 2
    from tradeoff.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="rope_scaling"):
        LlamaConfig.from_hf({**doc, "rope_scaling": {"rope_type": "llama3", "factor": 8}})
    with pytest.raises(ModelLoadError, match="lacks 'vocab_size'"):
        LlamaConfig.from_hf({k: v for k, v in doc.items() if k != "vocab_size"})


@pytest.mark.parametrize(("precision", "tolerance"), [("bf16", 0.08), ("int8", 0.08)])
def test_lower_precisions_stay_close_to_fp32_and_hold_fewer_bytes(
        models: tuple, precision: str, tolerance: float) -> None:
    reference, fp32 = models
    lower = LlamaDecoder(CONFIG, reference.state_dict(), precision=precision)
    tokens = torch.tensor([1, 5, 9, 13, 40, 41, 42, 7])
    logits = {}
    for name, decoder in (("fp32", fp32), (precision, lower)):
        cache = decoder.new_cache(num_blocks=4, block_size=BLOCK)
        (logits[name],) = decoder.step([SequenceStep(tokens, 0, torch.arange(8))], cache,
                                       all_logits=True)
    assert logits[precision].dtype == torch.float32
    scale = logits["fp32"].abs().max()
    assert (logits[precision] - logits["fp32"]).abs().max() / scale < tolerance
    assert not torch.equal(logits[precision], logits["fp32"])  # it did change precision
    assert lower.weight_bytes < fp32.weight_bytes
    if precision == "bf16":
        assert lower.new_cache(1, BLOCK).keys.dtype == torch.bfloat16
    else:
        assert "model.layers.0.self_attn.qkv_proj.weight" in lower.packed
        assert "model.layers.0.mlp.down_proj.weight" not in lower.packed  # kept FP32


def test_an_unknown_precision_is_a_load_error(models: tuple) -> None:
    from tradeoff.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="precision 'fp8': expected one of"):
        LlamaDecoder(CONFIG, models[0].state_dict(), precision="fp8")
