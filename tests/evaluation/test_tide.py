"""TIDE's error breakdown (visiontf.evaluation.readouts.tide): hand-made cases worked out on paper, and tidecv's own numbers.

The last test compares against tidecv 1.0.1 itself, run by ``scripts/experiments/tide_vs_tidecv.py --record`` on
the 100 real val2017 annotations and a generated set with crowd regions (``tests/fixtures/tide/tide_reference.json``
holds the detections and tidecv's numbers; tidecv is no dependency, see the script's docstring).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from visiontf.evaluation.readouts.tide import ERROR_TYPES, SPECIAL_TYPES, tide_ap, tide_errors

REPO = Path(__file__).resolve().parents[2]
A, B = 1, 2


def gt_of(*images: list[tuple]) -> dict:
    """``images``: per image a list of (category, [x, y, w, h]) or (category, box, "crowd")."""
    anns, aid = [], 1
    for i, objects in enumerate(images):
        for obj in objects:
            anns.append({"id": aid, "image_id": i, "category_id": obj[0], "bbox": list(obj[1]),
                         "area": obj[1][2] * obj[1][3], "iscrowd": int(len(obj) > 2)})
            aid += 1
    return {"images": [{"id": i, "width": 200, "height": 200} for i in range(len(images))], "annotations": anns,
            "categories": [{"id": A, "name": "a"}, {"id": B, "name": "b"}]}


def det(image: int, cat: int, box: list[float], score: float) -> dict:
    return {"image_id": image, "category_id": cat, "bbox": box, "score": score}


BOX = [10, 10, 40, 40]
FAR = [120, 120, 40, 40]


def test_tide_ap_on_a_curve_worked_by_hand():
    # TP, FP, TP over 2 objects: precision 1, 1/2, 2/3 -> smoothed 1, 2/3, 2/3; recall 1/2, 1/2, 1:
    # recall points 0..0.50 (51 of them) take 1, 0.51..1 (50) take 2/3
    assert tide_ap([(0.9, True), (0.8, False), (0.7, True)], 2) == pytest.approx((51 + 50 * 2 / 3) / 101 * 100)
    assert tide_ap([(0.9, True)], 2) == pytest.approx(51 / 101 * 100)  # half the objects found, nothing else
    assert tide_ap([(0.5, False)], 0) == 0 and tide_ap([], 3) == 0


def test_perfect_detections_have_no_error():
    gt = gt_of([(A, BOX), (B, FAR)])
    report = tide_errors(gt, [det(0, A, BOX, 0.9), det(0, B, FAR, 0.8)])
    assert report.ap == pytest.approx(100)
    assert all(v == 0 for v in report.main.values()) and all(v == 0 for v in report.counts.values())


def test_localisation_error_fixed_is_a_true_positive():
    # IoU of [10,10,40,40] and [10,10,40,13.33]: 1/3, between t_b 0.1 and t_f 0.5
    gt = gt_of([(A, BOX)])
    report = tide_errors(gt, [det(0, A, [10, 10, 40, 40 / 3], 0.9)])
    assert report.counts == {"Cls": 0, "Loc": 1, "Both": 0, "Dupe": 0, "Bkg": 0, "Miss": 0}  # its object is no Miss
    assert report.ap == 0 and report.main["Loc"] == pytest.approx(100)
    assert report.main["Miss"] == 0  # the object is the Loc error's, not a Miss


def test_classification_error_fixed_moves_the_detection_to_the_right_class():
    gt = gt_of([(A, BOX)])
    report = tide_errors(gt, [det(0, B, [11, 10, 40, 40], 0.9)])
    assert report.counts["Cls"] == 1 and report.counts["Miss"] == 0
    # before: class a (1 object, no TP) 0 and class b (a FP, no object) 0; after: a 100, b has nothing (not averaged)
    assert report.ap == 0 and report.main["Cls"] == pytest.approx(100) and report.main["Bkg"] == 0


def test_duplicate_costs_precision_and_its_fix_removes_it():
    gt = gt_of([(A, BOX), (A, FAR)])
    dets = [det(0, A, BOX, 0.9), det(0, A, [12, 10, 40, 40], 0.8), det(0, A, FAR, 0.7)]
    report = tide_errors(gt, dets)
    assert report.counts == {"Cls": 0, "Loc": 0, "Both": 0, "Dupe": 1, "Bkg": 0, "Miss": 0}
    assert report.ap == pytest.approx((51 + 50 * 2 / 3) / 101 * 100)
    assert report.main["Dupe"] == pytest.approx(100 - report.ap)
    assert report.special["FalsePos"] == pytest.approx(100 - report.ap)  # the duplicate scored 0


def test_background_error_and_perfect_precision():
    gt = gt_of([(A, BOX)])
    report = tide_errors(gt, [det(0, A, FAR, 0.9), det(0, A, BOX, 0.5)])
    # FP then TP: precision 0, 1/2 -> smoothed 1/2, 1/2 at recall 0, 1: every recall point takes 1/2
    assert report.counts["Bkg"] == 1 and report.ap == pytest.approx(50)
    assert report.main["Bkg"] == pytest.approx(50) and report.special["FalsePos"] == pytest.approx(50)
    assert report.special["FalseNeg"] == 0


def test_missed_object_and_perfect_recall():
    gt = gt_of([(A, BOX), (A, FAR)], [(B, BOX)])  # image 1 has no detection at all: its object is missed too
    report = tide_errors(gt, [det(0, A, BOX, 0.9)])
    assert report.counts["Miss"] == 2
    # a: recall 1/2 at precision 1 -> 51/101; b: 0 -> mean
    assert report.ap == pytest.approx(51 / 101 * 100 / 2)
    assert report.main["Miss"] == pytest.approx(100 - report.ap)  # both objects uncounted: a 100, b empty
    assert report.special["FalseNeg"] == pytest.approx(100 - report.ap)


def test_both_wrong_class_and_poor_box():
    gt = gt_of([(A, BOX)])
    report = tide_errors(gt, [det(0, B, [10, 10, 40, 40 / 3], 0.9)])  # class b, IoU 1/3 with the a object
    assert report.counts == {"Cls": 0, "Loc": 0, "Both": 1, "Dupe": 0, "Bkg": 0, "Miss": 1}
    assert report.ap == 0 and report.main["Both"] == 0  # suppressing it leaves a's missed object at AP 0


def test_only_the_best_scoring_error_of_an_object_becomes_a_true_positive():
    gt = gt_of([(A, BOX)])
    dets = [det(0, A, [10, 10, 40, 40 / 3], 0.9), det(0, A, [10, 10, 40 / 3, 40], 0.6)]  # two Loc errors, one object
    report = tide_errors(gt, dets)
    assert report.counts["Loc"] == 2
    assert report.main["Loc"] == pytest.approx(100)  # the 0.9 one fixed, the 0.6 one suppressed (not a FP left)


def test_a_detection_inside_a_crowd_region_of_its_class_is_ignored_but_binned():
    gt = gt_of([(A, BOX), (A, [100, 100, 90, 90], "crowd")])
    dets = [det(0, A, BOX, 0.5), det(0, A, [110, 110, 30, 30], 0.9)]  # the 0.9 one lies inside the crowd
    report = tide_errors(gt, dets)
    assert report.ap == pytest.approx(100)  # ignored: no false positive ranks above the true one
    assert report.counts["Bkg"] == 1  # IoU with the one object is 0, so TIDE still bins it as background
    other = tide_errors(gt_of([(A, BOX), (B, [100, 100, 90, 90], "crowd")]), dets)  # a crowd of another class
    assert other.ap == pytest.approx(50)


def test_only_the_listed_images_count():
    gt = gt_of([(A, BOX)], [(A, BOX)])
    dets = [det(0, A, BOX, 0.9)]
    assert tide_errors(gt, dets).counts["Miss"] == 1
    assert tide_errors(gt, dets, img_ids=[0]).counts["Miss"] == 0 and tide_errors(gt, dets, img_ids=[0]).ap == 100


def test_report_json_and_table():
    report = tide_errors(gt_of([(A, BOX)]), [det(0, A, FAR, 0.9), det(0, A, BOX, 0.5)])
    payload = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert set(payload["dAP"]) == set(ERROR_TYPES) and set(payload["special_dAP"]) == set(SPECIAL_TYPES)
    table = report.table()
    assert table.startswith("bbox AP @ 50: 50.00") and " Bkg " in table and " 50.00" in table


def test_equals_tidecv_on_the_recorded_cases():
    """tidecv 1.0.1's numbers on the same detections (recorded by scripts/experiments/tide_vs_tidecv.py --record)."""
    recorded = json.loads((REPO / "tests" / "fixtures" / "tide" / "tide_reference.json").read_text())
    assert {c["name"] for c in recorded["cases"]} == {"coco_real_100_seed0", "generated_with_crowds"}
    for case in recorded["cases"]:
        gt = case["gt"] or json.loads((REPO / case["annotations"]).read_text())
        ours, theirs = tide_errors(gt, case["detections"]), case["tidecv"]
        assert ours.counts == theirs["counts"], case["name"]
        assert ours.ap == pytest.approx(theirs["ap"], abs=1e-9), case["name"]
        for k in ERROR_TYPES:
            assert ours.main[k] == pytest.approx(theirs["main"][k], abs=1e-9), (case["name"], k)
        for k in SPECIAL_TYPES:
            assert ours.special[k] == pytest.approx(theirs["special"][k], abs=1e-9), (case["name"], k)
        assert sum(theirs["counts"].values()) > 100 and min(theirs["main"].values()) >= 0 and theirs["main"]["Cls"] > 1
