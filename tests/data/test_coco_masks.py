"""COCO instance masks in the data path: pycocotools' decoding (polygons, RLE, crowd RLE), masks that follow
every augmentation, the synthetic sets' exact masks, and clear errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from torchvision.ops import masks_to_boxes

from visiontf.data.transforms import detection as DT
from visiontf.tasks.detection.coco_annotations import AnnotationError
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.coco_dataset import CocoDetection
from visiontf.tasks.detection.coco_masks import decode_segmentation, encode_mask
from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

REAL = "tests/fixtures/coco_real"


@pytest.mark.parametrize("split", ["train", "val"])
def test_decoding_equals_pycocotools_coco_on_real_annotations(split):
    """Polygons, and the crowd regions' uncompressed RLE, as ``COCO.annToMask`` decodes them."""
    coco = COCO(f"{REAL}/annotations/instances_{split}2017.json")
    kinds = set()
    for ann in coco.dataset["annotations"]:
        img = coco.imgs[ann["image_id"]]
        got = decode_segmentation(ann["segmentation"], img["height"], img["width"])
        assert np.array_equal(got, coco.annToMask(ann))
        kinds.add((ann["iscrowd"], type(ann["segmentation"]).__name__))
        back = encode_mask(got)  # compressed RLE, JSON-ready, decodes to the same mask
        assert isinstance(back["counts"], str)
        assert np.array_equal(decode_segmentation(back, img["height"], img["width"]), got)
    assert kinds == {(0, "list"), (1, "dict")}


def test_dataset_masks_equal_pycocotools_on_real_images():
    ds = CocoDetection(f"{REAL}/val2017", f"{REAL}/annotations/instances_val2017.json", masks=True)
    coco = COCO(f"{REAL}/annotations/instances_val2017.json")
    for i in range(len(ds)):
        image, target = ds[i]
        anns = [a for a in coco.imgToAnns[target["image_id"]] if not a["iscrowd"]]
        assert target["masks"].shape == (len(anns), *image.shape[-2:]) and target["masks"].dtype == torch.uint8
        for mask, ann in zip(target["masks"], anns):
            assert np.array_equal(mask.numpy(), coco.annToMask(ann))


def _mask_boxes_agree(target, tolerance_px: float) -> None:
    """Each kept mask's extent is its (transformed) box, within ``tolerance_px``."""
    h, w = target["size"].tolist()
    boxes = target["boxes"] * torch.tensor([w, h, w, h])
    xyxy = torch.cat([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], 1)
    visible = target["masks"].bool().flatten(1).any(1)
    from_masks = masks_to_boxes(target["masks"][visible]) + torch.tensor([0, 0, 1, 1])
    assert len(target["masks"]) == len(target["labels"]) == len(boxes)
    assert (from_masks - xyxy[visible]).abs().max() <= tolerance_px, (from_masks, xyxy[visible])


def test_masks_follow_flips_resizes_and_crops(tmp_path):
    paths = make_detection_dataset(tmp_path / "shapes", num_train=8, num_val=2, max_objects=1, object_size=(0.15, 0.3))
    ds = CocoDetection(paths["train_images"], paths["train_ann"], masks=True)
    ds.transform = DT.build_train_transforms(scales=(96, 112, 128), max_size=200, crop_scales=(100, 120), crop_size=(60, 90),
                                             seed=3)
    seen, sizes = 0, set()
    for _ in range(6):
        for i in range(len(ds)):
            _, target = ds[i]
            sizes.add(tuple(target["size"].tolist()))
            if len(target["boxes"]):
                seen += 1
                # one shape per image: its mask's extent is its box (rasterised ~1.5 px apart, times the resize scale)
                _mask_boxes_agree(target, tolerance_px=4.5)
    assert seen > 30 and len(sizes) > 10  # many draws of the flip / resize / crop paths


def test_synthetic_masks_are_the_painted_pixels(tmp_path):
    paths = make_detection_dataset(tmp_path / "demo", num_train=6, num_val=2, image_size=(96, 112),
                                   object_size=(0.15, 0.35), max_objects=4, colour_by_class=True)
    data = json.loads(paths["train_ann"].read_text())
    for img in data["images"]:
        anns = [a for a in data["annotations"] if a["image_id"] == img["id"]]
        masks = np.stack([decode_segmentation(a["segmentation"], img["height"], img["width"]) for a in anns] or
                         [np.zeros((img["height"], img["width"]), np.uint8)])
        assert masks.sum(0).max() <= 1  # visible pixels: no two shapes claim one pixel
        for a, m in zip(anns, masks):
            assert isinstance(a["segmentation"], dict)
            if m.any():  # inside the shape's box
                ys, xs = np.nonzero(m)
                x, y, w, h = a["bbox"]
                assert x - 1 <= xs.min() and xs.max() <= x + w + 1 and y - 1 <= ys.min() and ys.max() <= y + h + 1
    ds = CocoDetection(paths["train_images"], paths["train_ann"], masks=True)
    _, target = ds[0]
    assert target["masks"].shape[0] == len(target["labels"])


def test_old_polygon_sets_still_load_with_masks(tmp_path):
    """Sets written before the masks were exact carry the shape's polygon: they load, with masks."""
    paths = make_detection_dataset(tmp_path / "old", num_train=4, num_val=2)
    data = json.loads(paths["train_ann"].read_text())
    for a in data["annotations"]:
        x, y, w, h = a["bbox"]
        a["segmentation"] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
    paths["train_ann"].write_text(json.dumps(data))
    dm = CocoDataModule(paths["root"], masks=True, scales=(96,), max_size=160, crop_scales=(80,), crop_size=(64, 80),
                        val_size=96, num_workers=0)
    dm.setup("fit")
    images, mask, targets = next(iter(dm.train_dataloader()))
    for t in targets:
        assert t["masks"].shape[-2:] == tuple(t["size"].tolist())
        assert t["masks"].shape[0] == len(t["boxes"])


def _write(tmp_path, data):
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(data))
    (tmp_path / "img").mkdir(exist_ok=True)
    return path


def _tiny(segmentation, iscrowd=0):
    return {"images": [{"id": 1, "file_name": "a.jpg", "width": 20, "height": 10}],
            "categories": [{"id": 1, "name": "x"}],
            "annotations": [{"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": iscrowd,
                             **({} if segmentation is None else {"segmentation": segmentation})}]}


@pytest.mark.parametrize("segmentation,match", [
    (None, "annotation id 7 has no 'segmentation'.*masks: false"),
    ([[1, 2, 3, 4]], "annotation id 7: polygon .* at least 3"),
    ({"counts": [5, 5], "size": [10, 20]}, "annotation id 7: uncompressed RLE .* summing to height x width = 200"),
    ({"counts": "abc"}, "annotation id 7: RLE 'size'"),
])
def test_bad_segmentations_are_named(tmp_path, segmentation, match):
    path = _write(tmp_path, _tiny(segmentation))
    with pytest.raises(AnnotationError, match=match):
        CocoDetection(tmp_path / "img", path, masks=True)
    CocoDetection(tmp_path / "img", path)  # boxes only: the masks are not needed
    CocoDetection(tmp_path / "img", _write(tmp_path, _tiny(None, iscrowd=1)), masks=True)  # crowd: not trained on


def test_rle_of_another_size_than_the_image(tmp_path):
    from PIL import Image

    data = _tiny(encode_mask(np.ones((10, 20), np.uint8)))
    path = _write(tmp_path, data)
    Image.new("RGB", (30, 10)).save(tmp_path / "img" / "a.jpg")  # 30 wide, annotated 20
    ds = CocoDetection(tmp_path / "img", path, masks=True)
    with pytest.raises(AnnotationError, match="image id 1 .*30x10.*RLE mask must have its image's size"):
        ds[0]


def test_mosaic_with_masks_is_refused(tmp_path):
    path = _write(tmp_path, _tiny([[1, 1, 5, 1, 5, 5]]))
    with pytest.raises(ValueError, match="mosaic does not carry instance masks"):
        CocoDetection(tmp_path / "img", path, masks=True, mosaic=True)
