"""PQ, SQ, RQ equal cocodataset/panopticapi's ``pq_compute``, to the last bit.

panopticapi's own results are recorded in ``tests/fixtures/panopticapi/`` by ``scripts/fixtures/make_panopticapi.py``,
which runs a checkout of it (one worker, so that its sums run in the images' order):

* ``pq_compute``: a generated set, stored as id maps and segments (hand-made images for IoU exactly 0.5 and just
  above, void on either side, crowd regions with predictions of their category and of another, two crowd regions of
  one category, an image without ground truth, an empty prediction, a listed segment absent from its PNG, confused
  categories, ids above 2^16; and a random set), with panopticapi's totals and every image's own counts;
* ``panoptic_small``: its numbers (and printed table) on the files of ``tests/fixtures/panoptic_small``.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image
from reference.fixtures import load_fixture

from visiontf.evaluation.panoptic import PanopticEvalError, format_pq_table, pq_compute, pq_image_stats
from visiontf.io.panoptic_ids import id2rgb

ROOT = "tests/fixtures/panoptic_small"


def _expected(outputs: dict) -> dict:
    """panopticapi's result dict from the fixture's tensors."""
    out = {name: dict(zip(("pq", "sq", "rq", "n"), outputs[name].tolist())) for name in ("All", "Things", "Stuff")}
    out["per_class"] = {int(c): {"pq": pq, "sq": sq, "rq": rq} for c, pq, sq, rq in outputs["per_class"].tolist()}
    return out


def _assert_same(got: dict, want: dict) -> None:
    for part in ("All", "Things", "Stuff"):
        assert got[part] == want[part], part  # equal to the last bit
    assert got["per_class"] == want["per_class"]


def test_equals_panopticapi_on_fixed_files():
    fixture = load_fixture("panopticapi", "panoptic_small")
    got = pq_compute(f"{ROOT}/gt.json", f"{ROOT}/pred.json", f"{ROOT}/gt", f"{ROOT}/pred")
    _assert_same(got, _expected(fixture.outputs["float64"]))
    assert format_pq_table(got) == "\n".join(fixture.meta["printed_table"])


def _generated_set(fixture, folder):
    """The fixture's id maps and segments as panopticapi's files (gt.json + gt/, pred.json + pred/)."""
    x = fixture.inputs
    categories = [{"id": int(c), "name": f"c{c}", "isthing": int(t)} for c, t in x["categories"].tolist()]
    gt_ann, pred_ann = [], []
    for side in ("gt", "pred"):
        (folder / side).mkdir(parents=True)
    for i in range(fixture.meta["images"]):
        name = f"{i:03d}.png"
        Image.fromarray(id2rgb(x[f"gt.{i}"].numpy())).save(folder / "gt" / name)
        Image.fromarray(id2rgb(x[f"pred.{i}"].numpy())).save(folder / "pred" / name)
        gt_ann.append({"image_id": i + 1, "file_name": name, "segments_info": [
            {"id": s, "category_id": c, "iscrowd": k, "area": a} for s, c, k, a in x[f"gt_segments.{i}"].tolist()]})
        pred_ann.append({"image_id": i + 1, "file_name": name,
                         "segments_info": [{"id": s, "category_id": c} for s, c in x[f"pred_segments.{i}"].tolist()]})
    (folder / "gt.json").write_text(json.dumps({"annotations": gt_ann, "categories": categories}))
    (folder / "pred.json").write_text(json.dumps({"annotations": pred_ann}))
    return gt_ann, pred_ann, {c["id"]: c for c in categories}


def test_equals_panopticapi_on_a_generated_set(tmp_path):
    fixture = load_fixture("panopticapi", "pq_compute")
    want = fixture.outputs["float64"]
    gt_ann, pred_ann, categories = _generated_set(fixture, tmp_path)
    got = pq_compute(tmp_path / "gt.json", tmp_path / "pred.json")
    _assert_same(got, _expected(want))
    assert format_pq_table(got) == "\n".join(fixture.meta["printed_table"])
    # one category is in no image: it counts in no average
    assert got["per_class"][4] == {"pq": 0.0, "sq": 0.0, "rq": 0.0} and got["All"]["n"] == len(categories) - 1
    # every image's own counts per category, as panopticapi's for that image alone
    for i, (g, p) in enumerate(zip(gt_ann, pred_ann)):
        stats = pq_image_stats(fixture.inputs[f"gt.{i}"].numpy().astype(np.int64), g["segments_info"],
                               fixture.inputs[f"pred.{i}"].numpy().astype(np.int64), p["segments_info"], categories, i + 1)
        expected = {int(c): [iou, int(tp), int(fp), int(fn)] for c, iou, tp, fp, fn in want[f"image.{i}"].tolist()}
        assert stats == expected, i


def test_inconsistent_predictions_are_refused_as_panopticapi_refuses_them():
    fixture = load_fixture("panopticapi", "pq_compute")
    gt = np.ones((4, 5), dtype=np.int64)
    gt_segments = [{"id": 1, "category_id": 1, "iscrowd": 0, "area": 20}]
    pred = np.full((4, 5), 2)
    messages = {"a PNG id not in segments_info": "image 8: segment id 2 is in the PNG but not in segments_info",
                "a segments_info id not in the PNG": "segment ids \\[5\\] are in segments_info but not in the PNG",
                "an unknown category": "unknown category_id 4"}
    for error in fixture.meta["errors"]:
        assert error["raises"] == "KeyError"
        with pytest.raises(PanopticEvalError, match=messages[error["case"]]):
            pq_image_stats(gt, gt_segments, pred, error["segments_info"], [1, 2], 8)
    assert pq_image_stats(gt, gt_segments, pred, [{"id": 2, "category_id": 1}], [1, 2]) == {1: [1.0, 1, 0, 0]}


def test_folders_default_to_the_json_paths(tmp_path):
    for name in ("gt", "pred"):
        shutil.copytree(f"{ROOT}/{name}", tmp_path / name)
        shutil.copy(f"{ROOT}/{name}.json", tmp_path / f"{name}.json")
    want = load_fixture("panopticapi", "panoptic_small").outputs["float64"]["All"][0].item()
    assert pq_compute(tmp_path / "gt.json", tmp_path / "pred.json")["All"]["pq"] == want


@pytest.mark.parametrize("field, value, words", [
    ("isthing", "1", r"categories\[0\] has isthing '1'; isthing is 0 or 1"),  # PQ counted such things as stuff
    ("iscrowd", "1", r"image id 1 has segment \d+ with iscrowd '1'"),  # a crowd region for AP, an object for PQ
    ("area", 0, r"image 1: ground-truth segment \d+ has area 0, but its PNG has \d+ pixels of it"),  # PQ was inf
    ("area", -5, r"image id 1 has segment \d+ with area -5; area is the segment's pixel count"),
    ("area", None, r"image id 1 has segment \d+ with area None"),
])
def test_a_ground_truth_field_pq_would_read_wrongly_is_refused(tmp_path, field, value, words):
    """The ground truth given as the prediction scores PQ 1 as it is; each change made it inf, lower, or a thing of
    stuff without a word (or a traceback)."""
    gt = json.loads(open(f"{ROOT}/gt.json").read())
    assert pq_compute(f"{ROOT}/gt.json", f"{ROOT}/gt.json", f"{ROOT}/gt", f"{ROOT}/gt")["All"]["pq"] == 1.0
    if field == "isthing":
        gt["categories"][0][field] = value
    else:
        gt["annotations"][0]["segments_info"][0][field] = value
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    with pytest.raises(PanopticEvalError, match=words):
        pq_compute(tmp_path / "gt.json", f"{ROOT}/pred.json", f"{ROOT}/gt", f"{ROOT}/pred")


def test_missing_prediction_is_an_error(tmp_path):
    pred = json.loads(open(f"{ROOT}/pred.json").read())
    pred["annotations"] = pred["annotations"][:2]
    (tmp_path / "pred.json").write_text(json.dumps(pred))
    with pytest.raises(PanopticEvalError, match="no prediction for the image with id 3"):
        pq_compute(f"{ROOT}/gt.json", tmp_path / "pred.json", f"{ROOT}/gt", f"{ROOT}/pred")


def test_a_ground_truth_png_with_an_unlisted_id_is_refused():
    """panopticapi leaves such pixels out without a word (neither a segment nor void): a broken ground truth
    scored as if it were right. visiontf names the image and the ids."""
    gt = np.ones((4, 5), dtype=np.int64)
    gt[0, :2] = 7  # painted, but not in segments_info
    gt_segments = [{"id": 1, "category_id": 1, "iscrowd": 0, "area": 18}]
    pred = np.full((4, 5), 2)
    with pytest.raises(PanopticEvalError, match=r"image 3: the ground truth's PNG has segment id\(s\) \[7\] that its "
                                                r"segments_info does not list"):
        pq_image_stats(gt, gt_segments, pred, [{"id": 2, "category_id": 1}], [1, 2], 3)
    gt[0, :2] = 0  # unlabelled pixels are fine
    assert pq_image_stats(gt, gt_segments, pred, [{"id": 2, "category_id": 1}], [1, 2], 3)[1][1] == 1


@pytest.mark.parametrize("which", ["gt", "pred"])
def test_a_png_named_outside_its_folder_is_refused(tmp_path, which):
    """pq_compute and PanopticMetric read each annotation's PNG from its folder; an absolute name is refused, not read."""
    from visiontf.tasks.detection.panoptic_metric import PanopticMetric

    shutil.copytree(ROOT, tmp_path / "p")
    data = json.loads((tmp_path / "p" / f"{which}.json").read_text())
    data["annotations"][0]["file_name"] = str(tmp_path / "p" / which / data["annotations"][0]["file_name"])
    (tmp_path / "p" / f"{which}.json").write_text(json.dumps(data))
    with pytest.raises(PanopticEvalError, match=rf"{which}\.json: the annotation of image id \d+ names its PNG .*, an "
                                                "absolute path"):
        pq_compute(tmp_path / "p" / "gt.json", tmp_path / "p" / "pred.json", tmp_path / "p" / "gt", tmp_path / "p" / "pred")
    if which == "gt":
        with pytest.raises(PanopticEvalError, match=r"gt\.json: the annotation of image id \d+ names its PNG"):
            PanopticMetric(tmp_path / "p" / "gt.json", tmp_path / "p" / "gt", {0: 1})


def test_a_panoptic_png_of_a_palette_or_opaque_rgba_reads_as_rgb_and_others_are_one_line(tmp_path):
    """Image tools save PNGs of few colours as palettes, and some add an alpha channel: the same colours, the same ids.
    A transparent or grey PNG was a bare ValueError through train.py."""
    from visiontf.io.panoptic_ids import PanopticPngError, read_panoptic_png

    ids = np.array([[0, 1, 1], [300, 300, 70000]], dtype=np.int64)
    rgb = Image.fromarray(id2rgb(ids))
    rgb.save(tmp_path / "rgb.png")
    rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=4).save(tmp_path / "p.png")
    rgb.convert("RGBA").save(tmp_path / "rgba.png")
    for name in ("rgb", "p", "rgba"):
        assert np.array_equal(read_panoptic_png(tmp_path / f"{name}.png"), ids), name
    see_through = np.asarray(rgb.convert("RGBA")).copy()
    see_through[0, 0, 3] = 0
    Image.fromarray(see_through).save(tmp_path / "clear.png")
    with pytest.raises(PanopticPngError, match=r"clear\.png: a panoptic PNG with transparent pixels"):
        read_panoptic_png(tmp_path / "clear.png")
    rgb.convert("L").save(tmp_path / "grey.png")
    with pytest.raises(PanopticPngError, match=r"grey\.png: a panoptic PNG is RGB .* this one is L"):
        read_panoptic_png(tmp_path / "grey.png")
