"""PQ, SQ, RQ equal panopticapi's ``pq_compute`` on fixed files (tests/data/panoptic_small, written by its
``make_files.py``: things and stuff, a crowd region, void pixels, IoU above and below 0.5, confused categories).

The expected numbers are panopticapi's own, produced with a checkout of cocodataset/panopticapi
(commit 7bb4655) by

    cd panopticapi && python -c "from panopticapi.evaluation import pq_compute; \
        print(pq_compute('gt.json', 'pred.json', 'gt', 'pred'))"   # paths of tests/data/panoptic_small

``benchmarks/panoptic_parity.py --panopticapi PATH`` reruns that comparison, and one on a synthetic set.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from visiontf.evaluation.panoptic import PanopticEvalError, format_pq_table, pq_compute, pq_image_stats

ROOT = "tests/data/panoptic_small"

#: panopticapi's output on these files (its repr, numpy floats as plain floats)
PANOPTICAPI = {
    "All": {"pq": 0.40261752136752144, "sq": 0.657051282051282, "rq": 0.4583333333333333, "n": 4},
    "Things": {"pq": 0.5927350427350428, "sq": 0.8891025641025642, "rq": 0.6666666666666666, "n": 2},
    "Stuff": {"pq": 0.2125, "sq": 0.425, "rq": 0.25, "n": 2},
    "per_class": {1: {"pq": 0.6111111111111112, "sq": 0.9166666666666667, "rq": 0.6666666666666666},
                  2: {"pq": 0.5743589743589744, "sq": 0.8615384615384616, "rq": 0.6666666666666666},
                  7: {"pq": 0.425, "sq": 0.85, "rq": 0.5},
                  9: {"pq": 0.0, "sq": 0, "rq": 0.0}},
}
#: the table it printed
TABLE = """          |    PQ     SQ     RQ     N
--------------------------------------
All       |  40.3   65.7   45.8     4
Things    |  59.3   88.9   66.7     2
Stuff     |  21.2   42.5   25.0     2"""


def test_equals_panopticapi_on_fixed_files():
    got = pq_compute(f"{ROOT}/gt.json", f"{ROOT}/pred.json", f"{ROOT}/gt", f"{ROOT}/pred")
    for part in ("All", "Things", "Stuff"):
        for k, v in PANOPTICAPI[part].items():
            assert got[part][k] == pytest.approx(v, abs=1e-12), (part, k)
    for cat, values in PANOPTICAPI["per_class"].items():
        assert got["per_class"][cat] == pytest.approx(values, abs=1e-12)
    assert format_pq_table(got) == TABLE


def test_folders_default_to_the_json_paths(tmp_path):
    import shutil

    for name in ("gt", "pred"):
        shutil.copytree(f"{ROOT}/{name}", tmp_path / name)
        shutil.copy(f"{ROOT}/{name}.json", tmp_path / f"{name}.json")
    assert pq_compute(tmp_path / "gt.json", tmp_path / "pred.json")["All"]["pq"] == pytest.approx(PANOPTICAPI["All"]["pq"])


def test_inconsistent_predictions_are_named():
    gt = np.ones((4, 5), dtype=np.int64)
    gt_segments = [{"id": 1, "category_id": 3, "iscrowd": 0, "area": 20}]
    pred = np.full((4, 5), 2)
    with pytest.raises(PanopticEvalError, match="image 8: segment id 2 is in the PNG but not in segments_info"):
        pq_image_stats(gt, gt_segments, pred, [], [3], 8)
    with pytest.raises(PanopticEvalError, match="segment ids \\[5\\] are in segments_info but not in the PNG"):
        pq_image_stats(gt, gt_segments, pred, [{"id": 2, "category_id": 3}, {"id": 5, "category_id": 3}], [3], 8)
    with pytest.raises(PanopticEvalError, match="unknown category_id 4"):
        pq_image_stats(gt, gt_segments, pred, [{"id": 2, "category_id": 4}], [3], 8)
    assert pq_image_stats(gt, gt_segments, pred, [{"id": 2, "category_id": 3}], [3]) == {3: [1.0, 1, 0, 0]}


def test_missing_prediction_is_an_error(tmp_path):
    pred = json.loads(open(f"{ROOT}/pred.json").read())
    pred["annotations"] = pred["annotations"][:2]
    (tmp_path / "pred.json").write_text(json.dumps(pred))
    with pytest.raises(PanopticEvalError, match="no prediction for the image with id 3"):
        pq_compute(f"{ROOT}/gt.json", tmp_path / "pred.json", f"{ROOT}/gt", f"{ROOT}/pred")
