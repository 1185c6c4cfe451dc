"""The duplicate rate reported beside mAP (visiontf.evaluation.duplicates)."""
import pytest

from visiontf.evaluation.duplicates import duplicate_stats


def det(image_id, cat, bbox, score):
    return {"image_id": image_id, "category_id": cat, "bbox": bbox, "score": score}


def test_counts_same_image_same_class_confident_overlaps_only():
    results = [
        det(1, 3, [0, 0, 10, 10], 0.9),
        det(1, 3, [0, 0, 10, 9], 0.8),  # IoU 0.9 with the first: a duplicate
        det(1, 4, [0, 0, 10, 10], 0.9),  # another class: not a duplicate
        det(2, 3, [0, 0, 10, 10], 0.9),  # another image
        det(1, 3, [0, 0, 10, 10], 0.2),  # not confident
        det(1, 3, [0, 0, 10, 6], 0.9),  # IoU 0.6 with the first, 0.667 with the second
    ]
    stats = duplicate_stats(results)
    assert stats["dup_pairs"] == 1
    assert stats["confident"] == 5
    assert stats["dup_rate"] == pytest.approx(1 / 5)


def test_three_copies_are_three_pairs_and_thresholds_apply():
    results = [det(7, 1, [5, 5, 20, 20], s) for s in (0.9, 0.5, 0.4)]
    assert duplicate_stats(results)["dup_pairs"] == 3
    assert duplicate_stats(results, score=0.45)["dup_pairs"] == 1
    assert duplicate_stats([], iou=0.5) == {"dup_pairs": 0.0, "confident": 0.0, "dup_rate": 0.0}
