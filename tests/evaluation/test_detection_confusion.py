"""The detection confusion matrix's convention (visiontf.evaluation.readouts.confusion), case by hand-made case.

Rows truth, columns prediction, the last of each "background"; score > threshold; one-to-one matching
across classes, greedy by score, IoU >= threshold; crowd regions of a detection's class swallow it.
"""
from __future__ import annotations

import json

import numpy as np

from visiontf.evaluation.readouts.confusion import BACKGROUND, detection_confusion_matrix

A, B, C = 1, 2, 5  # category ids with a gap: rows and columns follow the sorted ids
BOX = [10, 10, 40, 40]
FAR = [120, 120, 40, 40]


def gt_of(*images: list[tuple]) -> dict:
    anns, aid = [], 1
    for i, objects in enumerate(images):
        for obj in objects:
            anns.append({"id": aid, "image_id": i, "category_id": obj[0], "bbox": list(obj[1]),
                         "area": obj[1][2] * obj[1][3], "iscrowd": int(len(obj) > 2)})
            aid += 1
    return {"images": [{"id": i, "width": 200, "height": 200} for i in range(len(images))], "annotations": anns,
            "categories": [{"id": C, "name": "c"}, {"id": A, "name": "a"}, {"id": B, "name": "b"}]}


def det(image: int, cat: int, box: list[float], score: float = 0.9) -> dict:
    return {"image_id": image, "category_id": cat, "bbox": box, "score": score}


def cells(confusion) -> dict[tuple[str, str], int]:
    """The non-zero cells as {(true name, predicted name): count}."""
    names = confusion.names
    return {(names[i], names[j]): int(confusion.matrix[i, j]) for i, j in zip(*np.nonzero(confusion.matrix))}


def test_layout_names_and_perfect_detections():
    cm = detection_confusion_matrix(gt_of([(A, BOX), (B, FAR)], [(C, BOX)]),
                                    [det(0, A, BOX), det(0, B, FAR), det(1, C, BOX)])
    assert cm.names == ("a", "b", "c", BACKGROUND) and cm.cat_ids == (A, B, C)
    assert cm.matrix.shape == (4, 4)
    assert cells(cm) == {("a", "a"): 1, ("b", "b"): 1, ("c", "c"): 1}
    assert cm.missed.tolist() == [0, 0, 0] and cm.false_positives.tolist() == [0, 0, 0]


def test_a_confusion_is_neither_missed_nor_a_false_positive():
    cm = detection_confusion_matrix(gt_of([(A, BOX)]), [det(0, B, [11, 10, 40, 40])])
    assert cells(cm) == {("a", "b"): 1}


def test_missed_object_and_false_positive():
    cm = detection_confusion_matrix(gt_of([(A, BOX)]), [det(0, A, FAR)])
    assert cells(cm) == {("a", BACKGROUND): 1, (BACKGROUND, "a"): 1}
    assert cm.matrix[-1, -1] == 0


def test_score_threshold_is_strict():
    gt = gt_of([(A, BOX)])
    assert cells(detection_confusion_matrix(gt, [det(0, A, BOX, 0.5)], score_threshold=0.5)) == {("a", BACKGROUND): 1}
    assert cells(detection_confusion_matrix(gt, [det(0, A, BOX, 0.51)], score_threshold=0.5)) == {("a", "a"): 1}


def test_iou_threshold_is_inclusive():
    gt = gt_of([(A, [0, 0, 10, 10])])
    half = [det(0, A, [0, 0, 10, 5])]  # IoU exactly 50 / 100
    assert cells(detection_confusion_matrix(gt, half, iou_threshold=0.5)) == {("a", "a"): 1}
    assert cells(detection_confusion_matrix(gt, half, iou_threshold=0.51)) == {("a", BACKGROUND): 1, (BACKGROUND, "a"): 1}


def test_greedy_by_score_the_most_confident_claim_takes_the_object():
    """A b detection (0.9, IoU 0.6) and an a detection (0.8, IoU 0.95) on one a object: by score the b one
    takes it (a taken for b) and the a one is left a false positive. Matching by IoU (supervision,
    ultralytics) would give a -> a and a false b instead."""
    gt = gt_of([(A, [0, 0, 100, 100])])
    dets = [det(0, B, [0, 0, 100, 60], 0.9), det(0, A, [0, 0, 100, 95], 0.8)]
    assert cells(detection_confusion_matrix(gt, dets)) == {("a", "b"): 1, (BACKGROUND, "a"): 1}


def test_one_to_one_and_each_detection_takes_its_best_free_object():
    # two a objects side by side; the first detection overlaps the right one more, the second the left one
    left, right = [0, 0, 50, 50], [30, 0, 50, 50]
    gt = gt_of([(A, left), (A, right)])
    first, second = det(0, A, [25, 0, 50, 50], 0.9), det(0, A, [5, 0, 50, 50], 0.8)
    assert cells(detection_confusion_matrix(gt, [first, second])) == {("a", "a"): 2}
    # three detections, two objects: one is left over as a false positive
    extra = det(0, A, [28, 0, 50, 50], 0.7)
    assert cells(detection_confusion_matrix(gt, [first, second, extra])) == {("a", "a"): 2, (BACKGROUND, "a"): 1}
    # one object, two detections of it: one match and one false positive (a duplicate)
    assert cells(detection_confusion_matrix(gt_of([(A, BOX)]), [det(0, A, BOX, 0.9), det(0, A, BOX, 0.8)])) == {
        ("a", "a"): 1, (BACKGROUND, "a"): 1}


def test_crowd_regions_swallow_detections_of_their_class_only():
    crowd = [100, 100, 90, 90]
    inside = [110, 110, 30, 30]
    gt = gt_of([(A, BOX), (A, crowd, "crowd")])
    assert cells(detection_confusion_matrix(gt, [det(0, A, BOX), det(0, A, inside)])) == {("a", "a"): 1}
    assert cells(detection_confusion_matrix(gt, [det(0, A, BOX), det(0, B, inside)])) == {("a", "a"): 1, (BACKGROUND, "b"): 1}
    # a crowd region is no object to miss
    assert cells(detection_confusion_matrix(gt_of([(A, crowd, "crowd")]), [])) == {}


def test_images_without_objects_or_detections_and_image_subsets():
    gt = gt_of([(A, BOX)], [], [(B, BOX)])
    dets = [det(1, C, FAR), det(2, B, BOX)]
    assert cells(detection_confusion_matrix(gt, dets)) == {("a", BACKGROUND): 1, (BACKGROUND, "c"): 1, ("b", "b"): 1}
    assert cells(detection_confusion_matrix(gt, dets, img_ids=[2])) == {("b", "b"): 1}


def test_normalised_rows_and_json():
    gt = gt_of([(A, BOX), (A, FAR)], [(B, BOX)])
    dets = [det(0, A, BOX), det(0, B, FAR), det(1, A, FAR), det(1, C, [60, 60, 20, 20])]
    cm = detection_confusion_matrix(gt, dets)
    assert cells(cm) == {("a", "a"): 1, ("a", "b"): 1, ("b", BACKGROUND): 1, (BACKGROUND, "a"): 1, (BACKGROUND, "c"): 1}
    norm = cm.normalized()
    np.testing.assert_allclose(norm[0], [0.5, 0.5, 0, 0])  # a: half found, half taken for b
    np.testing.assert_allclose(norm[1], [0, 0, 0, 1])  # b: missed
    np.testing.assert_allclose(norm[2], [0, 0, 0, 0])  # c: no object, the row stays 0
    np.testing.assert_allclose(norm[3], [0.5, 0, 0.5, 0])  # false positives: half a, half c
    payload = json.loads(json.dumps(cm.to_json(), allow_nan=False))
    assert payload["matrix"] == cm.matrix.tolist() and payload["names"][-1] == BACKGROUND
    assert payload["score_threshold"] == 0.5 and payload["iou_threshold"] == 0.5 and "greedy by score" in payload["convention"]


def test_counts_add_up_on_real_annotations():
    """On the 100 real val2017 images: every object is on the diagonal, confused or missed, once; every
    confident detection is matched or a false positive, once, unless a crowd region of its class swallows it."""
    from readout_data import ANN_100, make_detections

    gt = json.loads(ANN_100.read_text())
    dets = make_detections(gt)
    cm = detection_confusion_matrix(gt, dets, score_threshold=0.3)
    objects = sum(1 for a in gt["annotations"] if not a["iscrowd"])
    confident = sum(1 for d in dets if d["score"] > 0.3)
    assert cm.matrix[:-1].sum() == objects
    assert np.trace(cm.matrix[:-1, :-1]) > 0 and cm.missed.sum() > 0 and cm.false_positives.sum() > 0
    assert 0 < confident - cm.matrix[:, :-1].sum()  # some fall in the 11 crowd regions
    no_crowds = {**gt, "annotations": [a for a in gt["annotations"] if not a["iscrowd"]]}
    assert detection_confusion_matrix(no_crowds, dets, score_threshold=0.3).matrix[:, :-1].sum() == confident


def test_thresholds_at_the_ends():
    gt = gt_of([(A, BOX)])
    assert cells(detection_confusion_matrix(gt, [det(0, A, BOX, 0.99)], score_threshold=0.99)) == {("a", BACKGROUND): 1}
    assert cells(detection_confusion_matrix(gt, [det(0, A, BOX, 0.0)], score_threshold=-0.1)) == {("a", "a"): 1}
