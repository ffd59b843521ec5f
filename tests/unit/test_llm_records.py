"""Records of streamed generations (gaps stay with their request through select and merge),
the prompt datasets and the --slo / length options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tradeoff.bench.endpoint import parse_slo
from tradeoff.bench.prompts import (
    fingerprint,
    parse_length,
    read_prompts,
    synthetic_prompts,
)
from tradeoff.bench.records import OK, Generated, RecordBuffer, Records
from tradeoff.errors import BenchSetupError, DatasetError


def generations() -> Records:
    buffer = RecordBuffer()
    for i, gaps in enumerate([(1, 2), (), (3, 4, 5), (6,)]):
        start = i * 1000
        buffer.add(start, start, start + 900, OK, 200, 10, 20, 1, None,
                   Generated(start + 100, len(gaps) + 1, 7, 4, True, gaps))
    return buffer.freeze()


def test_gaps_follow_their_requests() -> None:
    records = generations()
    assert records.generated and records.gaps_ns.tolist() == [1, 2, 3, 4, 5, 6]
    picked = records.select(np.array([False, True, True, False]))
    assert picked.gap_count.tolist() == [0, 3] and picked.gaps_ns.tolist() == [3, 4, 5]
    reordered = records.select(np.array([3, 0]))
    assert reordered.gaps_ns.tolist() == [6, 1, 2]
    assert records.gaps_of(np.array([True, False, False, True])).tolist() == [1, 2, 6]
    merged = Records.merge([records.select(np.array([2, 3])), records.select(np.array([0, 1]))],
                           [0, 0])
    assert merged.scheduled_ns.tolist() == [0, 1000, 2000, 3000]
    assert merged.gaps_ns.tolist() == [1, 2, 3, 4, 5, 6]


def test_ttft_and_tpot_columns() -> None:
    records = generations()
    assert records.ttft_ms.tolist() == pytest.approx([1e-4] * 4)
    tpot = records.tpot_ms
    assert np.isnan(tpot[1])  # one token: no TPOT
    assert tpot[2] == pytest.approx(800 / 1e6 / 3)


def test_tensor_records_are_not_generations() -> None:
    buffer = RecordBuffer()
    buffer.add(0, 0, 10, OK, 200, 1, 1, 1, None)
    records = buffer.freeze()
    assert not records.generated and np.isnan(records.ttft_ms[0])


def test_synthetic_prompts_are_reproducible() -> None:
    a = synthetic_prompts(20, (5, 50), (16, 256), seed=3)
    assert a == synthetic_prompts(20, (5, 50), (16, 256), seed=3)
    assert fingerprint(a) != fingerprint(synthetic_prompts(20, (5, 50), (16, 256), seed=4))
    assert all(len(item.prompt.split()) == item.input_words for item in a)  # type: ignore[union-attr]
    assert all(16 <= item.max_tokens <= 256 for item in a)
    chat = synthetic_prompts(2, (4, 4), (8, 8), chat=True)
    assert chat[0].prompt is None and chat[0].messages[0]["role"] == "user"  # type: ignore[index]


def test_jsonl_prompts(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello", "max_tokens": 5}\n\n{"prompt": "bye"}\n')
    items = read_prompts(path, (9, 9))
    assert [(i.prompt, i.max_tokens) for i in items] == [("hello", 5), ("bye", 9)]
    as_chat = read_prompts(path, (9, 9), chat=True)
    assert as_chat[0].messages == ({"role": "user", "content": "hello"},)
    for text, message in (('{"messages": [{"role": "user", "content": "x"}]}', "need --chat"),
                          ("[1]", "expected a JSON object"), ("{", "not JSON"),
                          ('{"prompt": "x", "max_tokens": 0}', "max_tokens must be"),
                          ('{"text": "x"}', "needs \"prompt\""), ("", "no prompts")):
        path.write_text(text + "\n")
        with pytest.raises(DatasetError, match=message):
            read_prompts(path, (9, 9))


def test_length_and_slo_options() -> None:
    assert parse_length("128", "--x") == (128, 128)
    assert parse_length("16:256", "--x") == (16, 256)
    for bad in ("0", "a", "9:3", "1:b"):
        with pytest.raises(DatasetError):
            parse_length(bad, "--x")
    assert parse_slo("ttft_ms=500, tpot_ms=50") == {"ttft_ms": 500, "tpot_ms": 50}
    assert parse_slo("") == {}
    for bad in ("ttft=5", "ttft_ms=-1", "ttft_ms", "e2e_ms=x"):
        with pytest.raises(BenchSetupError):
            parse_slo(bad)


def test_text_events_rebuild_every_arrival() -> None:
    buffer = RecordBuffer()
    buffer.add(0, 0, 900, OK, 200, 1, 1, 1, None, Generated(100, 3, 1, 3, True, (10, 20)))
    buffer.add(0, 0, 900, OK, 200, 1, 1, 1, None, Generated(0, 0, 1, 3, True, ()))
    buffer.add(0, 0, 900, OK, 200, 1, 1, 1, None, Generated(500, 4, 1, 3, True, (5,)))
    times, weights = buffer.freeze().text_events(np.ones(3, bool))
    assert times.tolist() == [100, 110, 130, 500, 505]
    assert weights.tolist() == [1, 1, 1, 2, 2]  # 4 tokens in 2 events: 2 each
