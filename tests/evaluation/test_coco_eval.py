"""COCO evaluation: both backends and CocoMetric against plain pycocotools; bad inputs; the CLI."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from visiontf.evaluation.coco import STAT_NAMES, CocoEvalError, evaluate_coco
from visiontf.evaluation.duplicates import duplicate_stats
from visiontf.tasks.detection.coco_metric import METRIC_NAMES, CocoMetric

REPO = Path(__file__).resolve().parents[2]
CAT_IDS = [1, 3, 7]  # non-contiguous on purpose
LABEL_TO_CAT = dict(enumerate(CAT_IDS))


def _q(v: float) -> float:
    # Quarter pixels are exact in float32, so xyxy <-> xywh round trips cannot move an IoU.
    return float(np.round(v * 4) / 4)


def make_gt_and_dets(seed: int = 0, num_images: int = 30) -> tuple[dict, list[dict]]:
    """Ground truth with small/medium/large boxes, crowd regions and empty images; near-GT detections."""
    rng = np.random.default_rng(seed)
    images, anns, dets = [], [], []
    aid = 1
    for i in range(num_images):
        img_id = 100 + 3 * i  # non-contiguous image ids
        w, h = 640, 480
        images.append({"id": img_id, "file_name": f"{img_id}.jpg", "width": w, "height": h})
        n = 0 if i % 7 == 3 else int(rng.integers(1, 8))
        for _ in range(n):
            side = float(np.exp(rng.uniform(np.log(6), np.log(300))))  # spans small, medium and large
            bw, bh = _q(side * rng.uniform(0.6, 1.4)), _q(side * rng.uniform(0.6, 1.4))
            x, y = _q(rng.uniform(0, w - bw)), _q(rng.uniform(0, h - bh))
            cat = int(rng.choice(CAT_IDS))
            crowd = int(rng.random() < 0.12)
            # COCO's area is the mask area, not the box area: make them differ.
            anns.append({"id": aid, "image_id": img_id, "category_id": cat, "bbox": [x, y, bw, bh],
                         "area": bw * bh * float(rng.uniform(0.5, 1.0)), "iscrowd": crowd})
            aid += 1
            for _ in range(int(rng.integers(0, 3))):  # 0..2 detections per object (duplicates = FPs)
                j = rng.normal(0, 0.08 * side, size=4)
                dets.append({"image_id": img_id, "category_id": cat if rng.random() < 0.85 else int(rng.choice(CAT_IDS)),
                             "bbox": [_q(x + j[0]), _q(y + j[1]), _q(max(bw + j[2], 1)), _q(max(bh + j[3], 1))],
                             "score": float(np.float32(rng.random()))})
        for _ in range(int(rng.integers(0, 4))):  # background false positives
            dets.append({"image_id": img_id, "category_id": int(rng.choice(CAT_IDS)),
                         "bbox": [_q(rng.uniform(0, 500)), _q(rng.uniform(0, 400)), _q(rng.uniform(4, 100)),
                                  _q(rng.uniform(4, 100))],
                         "score": float(np.float32(rng.random()))})
    gt = {"images": images, "annotations": anns,
          "categories": [{"id": c, "name": f"c{c}"} for c in CAT_IDS]}
    assert any(a["iscrowd"] for a in anns)
    return gt, dets


def pycocotools_reference(ann_file: Path, dets: list[dict], img_ids=None) -> tuple[list[float], str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        gt = COCO(str(ann_file))
        dt = gt.loadRes(copy.deepcopy(dets))
        ev = COCOeval(gt, dt, "bbox")
        if img_ids is not None:
            ev.params.imgIds = sorted(img_ids)
        ev.evaluate()
        ev.accumulate()
        out.truncate(0)
        out.seek(0)
        ev.summarize()
    return [float(s) for s in ev.stats], out.getvalue()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cocoeval")
    gt, dets = make_gt_and_dets()
    ann_file = tmp / "instances_val.json"
    ann_file.write_text(json.dumps(gt))
    res_file = tmp / "results.json"
    res_file.write_text(json.dumps(dets))
    ref, table = pycocotools_reference(ann_file, dets)
    return ann_file, res_file, gt, dets, ref, table


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval", "auto"])
def test_backends_match_pycocotools(data, backend):
    ann_file, res_file, gt, dets, ref, table = data
    assert 0.05 < ref[0] < 0.95 and ref[3] > -1 and ref[5] > -1  # a meaningful, all-areas case
    stats = evaluate_coco(ann_file, res_file, backend=backend)
    assert list(stats) == list(STAT_NAMES)
    np.testing.assert_allclose(list(stats.values()), ref, rtol=0, atol=1e-12)
    assert stats.table.strip() == table.strip()
    # A list of dicts and the loaded dict give the same, and the caller's dicts are not modified.
    before = copy.deepcopy(dets)
    again = evaluate_coco(gt, dets, backend=backend)
    assert dict(again) == dict(stats)
    assert dets == before


def test_auto_prefers_faster_coco_eval(data):
    ann_file, res_file, *_ = data
    assert evaluate_coco(ann_file, res_file).backend == "faster_coco_eval"


def test_img_ids_subset_matches_pycocotools(data):
    ann_file, _, gt, dets, *_ = data
    subset = [img["id"] for img in gt["images"][::2]]
    ref, _ = pycocotools_reference(ann_file, [d for d in dets if d["image_id"] in subset], subset)
    for backend in ("pycocotools", "faster_coco_eval"):
        stats = evaluate_coco(ann_file, [d for d in dets if d["image_id"] in subset], backend=backend, img_ids=subset)
        np.testing.assert_allclose(list(stats.values()), ref, rtol=0, atol=1e-12)


def test_unknown_image_id_is_an_error_naming_ids_and_file(data, tmp_path):
    ann_file, _, _, dets, *_ = data
    bad = dets + [dict(dets[0], image_id=999_999), dict(dets[1], image_id=999_999), dict(dets[0], image_id=-5)]
    path = tmp_path / "bad_results.json"
    path.write_text(json.dumps(bad))
    for backend in ("pycocotools", "faster_coco_eval"):
        with pytest.raises(CocoEvalError) as e:
            evaluate_coco(ann_file, path, backend=backend)
        msg = str(e.value)
        assert "bad_results.json" in msg and "999999" in msg and "-5" in msg and str(ann_file) in msg
        assert "3 result(s)" in msg and "2 image id(s)" in msg


def test_unknown_category_and_missing_fields_are_errors(data):
    ann_file, _, _, dets, *_ = data
    with pytest.raises(CocoEvalError, match=r"category id\(s\) \[2\]"):
        evaluate_coco(ann_file, dets + [dict(dets[0], category_id=2)])
    broken = dict(dets[0])
    del broken["score"]
    with pytest.raises(CocoEvalError, match=r"result #0 .*lacks 'score'"):
        evaluate_coco(ann_file, [broken] + dets)


def test_result_checks_name_the_same_entries_on_plain_json_numbers_and_on_anything_else(data):
    """The checks run as numpy arrays on plain JSON numbers (one pass in C) and result by result on anything
    else (a bool, a numpy scalar): both find the same entries, and odd values are named, never a crash."""
    from visiontf.evaluation.coco import invalid_results

    ann_file, _, _, dets, *_ = data
    bad = copy.deepcopy(dets)
    bad[3]["score"] = float("nan")
    bad[5]["bbox"][2] = -1.0
    bad[7]["bbox"][1] = float("inf")
    bad[8]["score"] = -0.5
    plain = invalid_results(bad)
    assert plain == {"score": [3, 8], "bbox": [5, 7]}
    mixed = copy.deepcopy(bad)
    mixed[0]["score"] = np.float64(mixed[0]["score"])  # a float subclass: accepted as before, checked one by one
    mixed[1]["bbox"] = tuple(mixed[1]["bbox"])
    assert invalid_results(mixed) == plain
    mixed[2]["score"] = True  # a bool is no score
    assert invalid_results(mixed)["score"] == [2, 3, 8]
    with pytest.raises(CocoEvalError, match=r"2 result\(s\) with a score .* #3: .*1 result\(s\) with a bbox .*#5"):
        evaluate_coco(ann_file, [d for i, d in enumerate(bad) if i != 7])
    for odd, index in ((dict(dets[4], bbox=[1.0, 2.0, 3.0]), 4), (dict(dets[4], bbox=None), 4),
                       (dict(dets[4], score="0.9"), 4)):
        results = copy.deepcopy(dets)
        results[index] = odd
        with pytest.raises(CocoEvalError, match=rf"1 result\(s\) with a non-numeric score or a bbox that is not .* #{index}:"):
            evaluate_coco(ann_file, results)


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_empty_results_do_not_crash(data, backend):
    ann_file, *_ = data
    stats = evaluate_coco(ann_file, [], backend=backend)
    # GT exists in every area range, so COCOeval gives 0 (not -1) everywhere.
    assert list(stats.values()) == [0.0] * 12


def test_metric_matches_pycocotools_and_ignores_repeated_images(data):
    ann_file, _, gt, dets, ref, _ = data
    metric = CocoMetric(ann_file, LABEL_TO_CAT, backend="pycocotools")
    by_image = {img["id"]: [] for img in gt["images"]}
    for d in dets:
        by_image[d["image_id"]].append(d)

    def pred(ds):
        xywh = torch.tensor([d["bbox"] for d in ds], dtype=torch.float32).reshape(-1, 4)
        xyxy = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1)
        labels = torch.tensor([CAT_IDS.index(d["category_id"]) for d in ds], dtype=torch.int64)
        return {"boxes": xyxy, "scores": torch.tensor([d["score"] for d in ds]), "labels": labels}

    ids = list(by_image)
    for start in range(0, len(ids), 4):  # batches of 4
        chunk = ids[start:start + 4]
        metric.update([pred(by_image[i]) for i in chunk], torch.tensor(chunk))
    # DistributedSampler pads the last batch with repeats; the repeat must not count, whatever it holds.
    metric.update([pred([]), pred(by_image[ids[0]][:1])], [ids[1], ids[2]])
    out = metric.compute()
    assert list(out) == list(METRIC_NAMES)
    got = [float(out[k]) for k in METRIC_NAMES]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
    # the duplicate rate of the kept copy of each image's detections (the repeat did not count)
    assert metric.last_duplicates == duplicate_stats(dets)

    fast = CocoMetric(ann_file, CAT_IDS, backend="faster_coco_eval")
    fast.update([pred(by_image[i]) for i in ids], ids)
    np.testing.assert_allclose([float(v) for v in fast.compute().values()], ref, rtol=0, atol=1e-6)


def test_metric_merges_ranks_and_deduplicates(data, monkeypatch):
    """Two ranks' states merged as DDP's gather would: an image seen on both counts once."""
    import visiontf.tasks.detection.coco_metric as cm

    ann_file, _, gt, dets, *_ = data
    ids = [img["id"] for img in gt["images"]]
    half = len(ids) // 2
    subsets = [ids[:half] + [ids[half]], ids[half:] + [ids[0]]]
    metrics = []
    for rank, subset in enumerate(subsets):
        monkeypatch.setattr(cm, "_rank", lambda r=rank: r)
        m = CocoMetric(ann_file, LABEL_TO_CAT, backend="faster_coco_eval")
        for i in subset:
            ds = [d for d in dets if d["image_id"] == i]
            xywh = torch.tensor([d["bbox"] for d in ds]).reshape(-1, 4)
            m.update([{"boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1),
                       "scores": torch.tensor([d["score"] for d in ds]),
                       "labels": torch.tensor([CAT_IDS.index(d["category_id"]) for d in ds])}], [i])
        metrics.append(m)
    metrics[0].merge_state(metrics[1])
    results, seen = metrics[0].results()
    assert seen == sorted(ids)
    assert len(results) == len(dets)
    ref, _ = pycocotools_reference(ann_file, dets)
    np.testing.assert_allclose([float(v) for v in metrics[0].compute().values()], ref, rtol=0, atol=1e-6)


def test_metric_errors(data):
    ann_file, *_ = data
    m = CocoMetric(ann_file, LABEL_TO_CAT)
    m.update([{"boxes": torch.tensor([[0.0, 0, 10, 10]]), "scores": torch.tensor([0.5]), "labels": torch.tensor([0])}],
             [123456])
    with pytest.raises(CocoEvalError, match="123456"):
        m.compute()
    m = CocoMetric(ann_file, LABEL_TO_CAT)
    m.update([{"boxes": torch.tensor([[0.0, 0, 10, 10]]), "scores": torch.tensor([0.5]), "labels": torch.tensor([7])}],
             [100])
    with pytest.raises(CocoEvalError, match=r"label\(s\) \[7\]"):
        m.compute()
    with pytest.raises(FileNotFoundError, match="nope.json"):
        CocoMetric(ann_file.parent / "nope.json", LABEL_TO_CAT)


def test_cli_prints_table_writes_stats_and_never_imports_torch(data, tmp_path):
    ann_file, res_file, _, _, ref, table = data
    out = tmp_path / "stats.json"
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(REPO / "tools" / "eval.py"),
         "--annotations", str(ann_file), "--predictions", str(res_file), "--output", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"orjson", "faster_coco_eval"} <= imported  # the import log is real: the fast reader and evaluator
    assert not {m for m in imported if m == "torch" or m.startswith("torch.") or m == "lightning"}
    assert proc.stdout.strip() == table.strip()
    stats = json.loads(out.read_text())
    np.testing.assert_allclose([stats[k] for k in STAT_NAMES], ref, rtol=0, atol=1e-12)


def test_cli_bad_input_exit_code(tmp_path, data):
    ann_file, *_ = data
    res = tmp_path / "r.json"
    res.write_text('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 0.3}')  # truncated
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "eval.py"), "--annotations",
                           str(ann_file), "--predictions", str(res)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "r.json: malformed JSON at line 1" in proc.stderr


def test_annotation_and_results_file_mistakes_are_named(data, tmp_path):
    ann_file, _, gt, dets, ref, _ = data
    no_area = copy.deepcopy(gt)
    del no_area["annotations"][2]["area"]
    with pytest.raises(CocoEvalError, match=rf"annotation id {no_area['annotations'][2]['id']} has no 'area'; .*w \* h"):
        evaluate_coco(no_area, dets)
    # what orjson refuses and Python's json reads: a byte-order mark (and NaN, tests/integration/test_no_silent_wrong_answers.py)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(dets).encode())
    assert list(evaluate_coco(ann_file, bom).values()) == ref
    with pytest.raises(CocoEvalError, match=r"image_id or category_id that is not a number"):
        evaluate_coco(gt, [dict(dets[0], image_id=[1])])


@pytest.mark.parametrize("field, value, message", [
    ("iscrowd", "no", r"annotation id 1 has iscrowd 'no'; iscrowd is 0"),
    ("iscrowd", None, r"annotation id 1 has iscrowd None"),
    ("area", "600", r"annotation id 1 has area '600'; area is the object's size in pixels"),
    ("area", float("nan"), r"annotation id 1 has area nan"),
    ("category_id", True, r"annotation id 1 has category_id True, a bool"),
    ("category_id", 99, r"annotation id 1 has category_id 99, which is not in 'categories'"),
    ("bbox", [1, 2, 3], r"annotation id 1 has bbox \[1, 2, 3\]; expected \[x, y, width, height\]"),
])
@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_a_ground_truth_field_of_the_wrong_kind_is_named_on_both_backends(data, backend, field, value, message):
    """What pycocotools stopped on with a bare ValueError/TypeError, or scored wrongly without a word: a NaN area
    counts an object in every size range, a category the file does not list leaves the object out."""
    _, _, gt, dets, _, _ = data
    bad = copy.deepcopy(gt)
    bad["annotations"][0][field] = value
    with pytest.raises(CocoEvalError, match=message):
        evaluate_coco(bad, dets, backend=backend)


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_a_ground_truth_without_iscrowd_scores_as_iscrowd_0(data, backend):
    """COCO's default (the dataset loader's and faster-coco-eval's; pycocotools stopped with a KeyError)."""
    _, _, gt, dets, _, _ = data
    plain = copy.deepcopy(gt)
    for ann in plain["annotations"]:
        ann["iscrowd"] = 0
    without = copy.deepcopy(plain)
    for ann in without["annotations"]:
        del ann["iscrowd"]
    assert list(evaluate_coco(without, dets, backend=backend).values()) == list(evaluate_coco(plain, dets, backend=backend).values())
    assert all("iscrowd" not in ann for ann in without["annotations"])  # the caller's dict is left as it was


@pytest.mark.parametrize("section", ["images", "categories"])
def test_ids_of_text_are_named_not_a_traceback_of_the_readouts(data, section):
    _, _, gt, dets, _, _ = data
    texts = copy.deepcopy(gt)
    texts[section][1]["id"] = str(texts[section][1]["id"])
    with pytest.raises(CocoEvalError, match=rf"{section}\[1\] has id '\d+', a str; COCO ids are integers"):
        evaluate_coco(texts, dets)


def test_segm_evaluation_of_box_results_is_one_line_naming_file_field_and_fix(tmp_path):
    """tools/eval.py --iou_type segm on results without masks ended in a raw KeyError: 'id' inside faster-coco-eval."""
    gt = {"images": [{"id": 1, "width": 100, "height": 100}], "categories": [{"id": 1, "name": "a"}],
          "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 30, 30], "area": 900,
                           "iscrowd": 0, "segmentation": [[10, 10, 40, 10, 40, 40, 10, 40]]}]}
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "boxes.json").write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [10, 10, 30, 30],
                                                      "score": 0.9}]))
    for backend in ("auto", "pycocotools", "faster_coco_eval"):
        proc = subprocess.run([sys.executable, str(REPO / "tools" / "eval.py"), "--annotations", str(tmp_path / "gt.json"),
                               "--predictions", str(tmp_path / "boxes.json"), "--iou_type", "segm", "--backend", backend],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr
        assert f"{tmp_path / 'boxes.json'}: result #0 " in lines[0] and "has no 'segmentation'" in lines[0]
        assert "--iou_type bbox" in lines[0]
