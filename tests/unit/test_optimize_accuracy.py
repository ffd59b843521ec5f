"""The accuracy metrics of tradeoff optimize, on cases with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from tradeoff.optimize.accuracy import (
    CLASSIFIER,
    EMBEDDING,
    TENSOR,
    compare_output,
    cosine_rows,
    output_kind,
    top1_agreement,
)


def test_cosine_of_same_opposite_and_orthogonal_rows() -> None:
    a = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    b = np.array([[2.0, 0.0], [5.0, 0.0], [-3.0, -4.0]])
    assert cosine_rows(a, b) == pytest.approx([1.0, 0.0, -1.0])


def test_top1_agreement_counts_rows_whose_argmax_moved() -> None:
    reference = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    candidate = np.array([[0.8, 0.2], [0.3, 0.7], [0.4, 0.6], [0.1, 0.9]])
    assert top1_agreement(reference, candidate) == 0.75


def test_the_kind_of_an_output_is_read_from_the_original_values() -> None:
    probabilities = np.array([[0.25, 0.75], [0.5, 0.5]], np.float32)
    unit_rows = np.array([[0.6, 0.8], [1.0, 0.0]], np.float32)
    logits = np.array([[2.0, -1.0], [0.5, 3.0]], np.float32)
    assert output_kind(probabilities) == CLASSIFIER
    assert output_kind(unit_rows) == EMBEDDING
    assert output_kind(logits) == TENSOR
    assert output_kind(np.ones((4,), np.float32)) == TENSOR  # not rows of a batch


def test_embedding_drop_is_one_minus_the_mean_cosine() -> None:
    reference = np.array([[1.0, 0.0], [0.0, -1.0]], np.float32)
    rotated = np.array([[np.cos(0.1), np.sin(0.1)], [0.0, -1.0]], np.float32)
    graded = compare_output("embedding", reference, rotated)
    assert graded.kind == EMBEDDING
    assert graded.metrics["cosine_min"] == pytest.approx(np.cos(0.1), abs=1e-6)
    assert graded.metrics["cosine_mean"] == pytest.approx((np.cos(0.1) + 1) / 2, abs=1e-6)
    assert graded.drop == pytest.approx(1 - (np.cos(0.1) + 1) / 2, abs=1e-6)


def test_classifier_drop_is_the_share_of_changed_answers() -> None:
    reference = np.array([[0.9, 0.1], [0.4, 0.6]], np.float32)
    candidate = np.array([[0.85, 0.15], [0.55, 0.45]], np.float32)
    graded = compare_output("probabilities", reference, candidate)
    assert graded.kind == CLASSIFIER
    assert graded.metrics["top1_agreement"] == 0.5
    assert graded.metrics["max_probability_difference"] == pytest.approx(0.15, abs=1e-6)
    assert graded.drop == 0.5


def test_other_outputs_are_graded_by_their_largest_error() -> None:
    reference = np.array([[10.0, -4.0], [2.0, 1.0]], np.float32)
    candidate = np.array([[10.5, -4.0], [2.0, 1.0]], np.float32)
    graded = compare_output("OUTPUT0", reference, candidate)
    assert graded.kind == TENSOR
    assert graded.metrics["max_abs_error"] == pytest.approx(0.5)
    assert graded.drop == pytest.approx(0.05)
    same = compare_output("OUTPUT0", reference, reference.copy())
    assert same.drop == 0.0


def test_outputs_of_different_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="differs from the original"):
        compare_output("y", np.zeros((2, 3)), np.zeros((2, 4)))
