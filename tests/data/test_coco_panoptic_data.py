"""The COCO panoptic format: the synthetic writer, the checked file, the Dataset's segments as targets with masks,
and the data module (its derived instances file for box and mask AP)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from visiontf.io.panoptic_ids import read_panoptic_png
from visiontf.tasks.detection.coco_annotations import AnnotationError
from visiontf.tasks.detection.coco_panoptic_data import CocoPanopticDataModule
from visiontf.tasks.detection.coco_panoptic_dataset import CocoPanoptic
from visiontf.tasks.detection.panoptic_synthetic import make_panoptic_dataset


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_panoptic_dataset(tmp_path_factory.mktemp("panoptic"), num_train=10, num_val=6, seed=1)


def test_writer_labels_every_pixel_once(shapes):
    data = json.loads(shapes["val_panoptic"].read_text())
    assert {c["name"]: c["isthing"] for c in data["categories"]} == {"circle": 1, "square": 1, "triangle": 1, "star": 1,
                                                                      "sky": 0, "ground": 0}
    for ann in data["annotations"]:
        ids = read_panoptic_png(shapes["val_segments"] / ann["file_name"])
        segs = {s["id"]: s for s in ann["segments_info"]}
        assert set(np.unique(ids).tolist()) == set(segs)  # no unlabelled pixel, no segment without pixels
        for seg_id, s in segs.items():
            assert s["area"] == int((ids == seg_id).sum())


def test_dataset_gives_each_segment_as_a_target(shapes):
    ds = CocoPanoptic(shapes["val_images"], shapes["val_panoptic"])
    assert ds.index.thing_classes == (0, 1, 2, 3) and ds.class_names == ["circle", "square", "triangle", "star", "sky", "ground"]
    for i in range(len(ds)):
        image, t = ds[i]
        assert t["masks"].shape == (len(t["labels"]), *image.shape[-2:])
        assert torch.equal(t["masks"].sum(0), torch.ones(image.shape[-2:], dtype=torch.int64))  # a partition of the image
        assert {4, 5} & set(t["labels"].tolist())  # stuff is a target too


def test_derived_instances_equal_the_writers(shapes):
    dm = CocoPanopticDataModule(shapes["root"], num_workers=0, scales=(96,), max_size=160, crop_scales=(80,),
                                crop_size=(64, 80), val_size=96)
    assert dm.thing_classes == (0, 1, 2, 3) and dm.num_classes == 6
    dm.setup("validate")
    derived = json.loads(dm.val_ann_file.read_text())
    written = json.loads(shapes["val_ann"].read_text())
    assert len(derived["annotations"]) == len(written["annotations"]) > 0
    for a, b in zip(derived["annotations"], written["annotations"]):
        assert (a["image_id"], a["category_id"], a["area"], a["iscrowd"]) == (b["image_id"], b["category_id"], b["area"], 0)
        assert np.array_equal(mask_utils.decode(a["segmentation"]), mask_utils.decode(b["segmentation"]))
    assert dm.val_panoptic_file == shapes["val_panoptic"] and dm.val_segments_dir == shapes["val_segments"]


def test_data_module_batches(shapes):
    dm = CocoPanopticDataModule(shapes["root"], batch_size=3, num_workers=0, scales=(96, 112), max_size=160,
                                crop_scales=(80,), crop_size=(64, 80), val_size=96)
    dm.setup("fit")
    images, mask, targets = next(iter(dm.train_dataloader()))
    for t in targets:
        assert t["masks"].shape == (len(t["boxes"]), *t["size"].tolist())
        assert (t["boxes"][:, 2:] > 0).all()


def test_inconsistent_files_are_named(tmp_path, shapes):
    data = json.loads(shapes["val_panoptic"].read_text())
    broken = dict(data, annotations=data["annotations"][1:])
    path = tmp_path / "panoptic.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(AnnotationError, match=r"image id \d+ .* has no entry in 'annotations'"):
        CocoPanoptic(shapes["val_images"], path, shapes["val_segments"])
    no_isthing = dict(data, categories=[{k: v for k, v in c.items() if k != "isthing"} for c in data["categories"]])
    path.write_text(json.dumps(no_isthing))
    with pytest.raises(AnnotationError, match="no 'isthing'"):
        CocoPanoptic(shapes["val_images"], path, shapes["val_segments"])


@pytest.mark.parametrize("where, field, value, words", [
    ("category", "isthing", "0", r"categories\[\d\] has isthing '0'; isthing is 0 or 1"),  # was a thing (bool("0"))
    ("category", "isthing", 2, r"isthing 2; isthing is 0 or 1"),  # a thing here, stuff to PQ
    ("segment", "iscrowd", "no", r"has segment \d+ with iscrowd 'no'; iscrowd is 0 or 1"),  # was a ValueError
    ("segment", "iscrowd", 2, r"has segment \d+ with iscrowd 2"),  # a crowd region for AP, an object for PQ
    ("segment", "category_id", True, r"has a segment with category_id True, a bool"),  # was category 1
    ("segment", "area", "big", r"has segment \d+ with area 'big'; area is the segment's pixel count"),
    ("annotation", "segments_info", None, r"segments_info is None, not a list of segments"),  # was a TypeError
    ("annotation", "image_id", [1], r"annotations\[0\] has image_id \[1\]; COCO image ids are integers"),
])
def test_a_panoptic_field_of_the_wrong_kind_is_refused_naming_entry_and_fix(tmp_path, shapes, where, field, value, words):
    data = json.loads(shapes["val_panoptic"].read_text())
    entry = {"category": data["categories"][-1], "annotation": data["annotations"][0],
             "segment": next((a["segments_info"][0] for a in data["annotations"] if a["segments_info"]), None)}[where]
    entry[field] = value
    path = tmp_path / "panoptic.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match=rf"panoptic\.json: .*{words}"):
        CocoPanoptic(shapes["val_images"], path, shapes["val_segments"])


def test_a_png_painted_with_an_unlisted_id_is_refused_naming_it(tmp_path, shapes):
    """It was accepted with exit 0: the pixels of the unlisted id trained as nothing."""
    import shutil

    from PIL import Image

    from visiontf.io.panoptic_ids import id2rgb

    segments = tmp_path / "segments"
    shutil.copytree(shapes["val_segments"], segments)
    data = json.loads(shapes["val_panoptic"].read_text())
    first = data["annotations"][0]
    ids = read_panoptic_png(segments / first["file_name"])
    ids[:3, :3] = 4242
    Image.fromarray(id2rgb(ids)).save(segments / first["file_name"])
    ds = CocoPanoptic(shapes["val_images"], shapes["val_panoptic"], segments)
    position = next(i for i, a in enumerate(ds.index.annotations) if a["file_name"] == first["file_name"])
    with pytest.raises(AnnotationError, match=rf"{first['file_name']}: segment id\(s\) \[4242\] are painted in the PNG "
                                              rf"of image id {first['image_id']} but not listed in its segments_info"):
        ds.load(position)
    ds.load((position + 1) % len(ds))  # the others load


@pytest.mark.parametrize("entry", ["images", "annotations"])
def test_an_image_or_png_named_outside_its_folder_is_refused(tmp_path, shapes, entry):
    """The image (``images[].file_name``) and the segment PNG (``annotations[].file_name``) are named relative to their
    folders; an absolute or climbing name would read a file elsewhere on the disk."""
    data = json.loads(shapes["val_panoptic"].read_text())
    data[entry][0]["file_name"] = "../../elsewhere.png"
    path = tmp_path / "panoptic.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match=rf"panoptic\.json: {entry}\[0\]\.file_name is '\.\./\.\./elsewhere\.png', "
                                              r"a path through '\.\.'"):
        CocoPanoptic(shapes["val_images"], path, shapes["val_segments"])
