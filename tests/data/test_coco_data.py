"""COCO detection data: boxes stay on their pixels under every augmentation, collate, bad inputs."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DistributedSampler, SequentialSampler

from visiontf.data.io import ImageReadError
from visiontf.data.transforms import detection as DT
from visiontf.tasks.detection.coco_annotations import AnnotationError
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.coco_dataset import CocoDetection, collate_detection
from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

MEAN = np.array(DT.IMAGENET_MEAN)[:, None, None]
STD = np.array(DT.IMAGENET_STD)[:, None, None]
COLOURS = {1: (255, 0, 0), 2: (0, 255, 0), 3: (0, 0, 255), 4: (255, 255, 0), 5: (255, 0, 255)}
# (category id, x, y, w, h): asymmetric left/right so flips are visible; #5 sits on the border.
RECTS = [(1, 20, 30, 90, 60), (2, 200, 40, 40, 120), (3, 300, 200, 80, 70), (4, 140, 230, 30, 30),
         (5, 360, 10, 40, 40)]
H, W = 300, 400
SMALL = dict(scales=range(160, 257, 32), max_size=400, crop_scales=(200, 250, 300), crop_size=(120, 200))


def write_coco(tmp: Path, images: list[dict], annotations: list[dict], categories=None, name="ann.json") -> Path:
    cats = categories if categories is not None else [{"id": c, "name": f"c{c}"} for c in sorted(COLOURS)]
    path = tmp / name
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": cats}))
    return path


@pytest.fixture()
def rect_set(tmp_path):
    img = np.zeros((H, W, 3), np.uint8)
    anns = []
    for i, (cat, x, y, w, h) in enumerate(RECTS):
        img[y:y + h, x:x + w] = COLOURS[cat]
        anns.append({"id": 10 + i, "image_id": 1, "category_id": cat, "bbox": [x, y, w, h], "area": w * h,
                     "iscrowd": 0})
    Image.fromarray(img).save(tmp_path / "a.png")  # lossless: colours stay pure
    ann = write_coco(tmp_path, [{"id": 1, "file_name": "a.png", "width": W, "height": H}], anns)
    return tmp_path, ann


def colour_extent(image: torch.Tensor, rgb: tuple[int, int, int]) -> tuple[int, int, int, int] | None:
    """xyxy (exclusive max) of the pixels of a colour in a normalised CHW image."""
    pix = (image.numpy() * STD + MEAN) * 255.0
    close = np.all(np.abs(pix - np.array(rgb)[:, None, None]) < 60, axis=0)
    if close.sum() < 4:
        return None
    ys, xs = np.nonzero(close)
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def test_boxes_follow_their_pixels_under_train_augmentation(rect_set):
    root, ann = rect_set
    ds = CocoDetection(root, ann, DT.build_train_transforms(**SMALL))
    label_to_cat = ds.label_to_cat_id
    flipped = cropped = plain = 0
    for seed in range(40):
        ds.transforms.set_random_seed(seed)
        image, target = ds[0]
        th, tw = target["size"].tolist()
        assert tuple(image.shape) == (3, th, tw)
        assert min(th, tw) in SMALL["scales"] or max(th, tw) <= SMALL["max_size"]
        aspect_changed = abs(tw / th - W / H) > 0.03
        cropped += aspect_changed
        boxes = target["boxes"].numpy()
        assert np.all((boxes >= 0) & (boxes <= 1))
        seen = set()
        for (cx, cy, bw, bh), label in zip(boxes, target["labels"].tolist()):
            cat = label_to_cat[label]
            seen.add(cat)
            x0, y0, x1, y1 = (cx - bw / 2) * tw, (cy - bh / 2) * th, (cx + bw / 2) * tw, (cy + bh / 2) * th
            ext = colour_extent(image, COLOURS[cat])
            if x1 - x0 < 4 or y1 - y0 < 4:  # a sliver left by a crop: interpolation blurs it away
                continue
            assert ext is not None, f"seed {seed}: box of category {cat} but no pixels of its colour"
            np.testing.assert_allclose(ext, (x0, y0, x1, y1), atol=2.5, err_msg=f"seed {seed}, category {cat}")
            if cat == 1 and not aspect_changed:
                flipped += cx > 0.5
                plain += cx < 0.5
        for cat, rgb in COLOURS.items():  # no visible object lost its box
            ext = colour_extent(image, rgb)
            if ext is not None and (ext[2] - ext[0]) > 3 and (ext[3] - ext[1]) > 3:
                assert cat in seen, f"seed {seed}: category {cat} visible at {ext} but its box was dropped"
    # Every path was exercised: crop path, multi-scale path, flipped and not flipped.
    assert cropped >= 5 and plain >= 3 and flipped >= 3, (cropped, plain, flipped)


def test_train_augmentation_is_reproducible_for_a_seed(rect_set):
    root, ann = rect_set
    a = CocoDetection(root, ann, DT.build_train_transforms(**SMALL, seed=3))
    b = CocoDetection(root, ann, DT.build_train_transforms(**SMALL, seed=3))
    for _ in range(5):
        (ia, ta), (ib, tb) = a[0], b[0]
        assert torch.equal(ia, ib) and torch.equal(ta["boxes"], tb["boxes"])


def test_val_transform_and_detr_size_rule(rect_set):
    # DETR's get_size_with_aspect_ratio, worked by hand.
    assert DT.resized_hw(480, 640, 800, 1333) == (800, 1066)
    assert DT.resized_hw(640, 480, 800, 1333) == (1066, 800)
    assert DT.resized_hw(100, 1000, 800, 1333) == (133, 1330)  # size lowered to round(1333 * 100 / 1000)
    assert DT.resized_hw(800, 1000, 800, 1333) == (800, 1000)  # already there: untouched
    assert DT.resized_hw(427, 640, 800, None) == (800, 1199)  # int() truncates 1199.06
    root, ann = rect_set
    ds = CocoDetection(root, ann, DT.build_val_transforms(size=200, max_size=300))
    image, target = ds[0]
    assert tuple(image.shape[1:]) == DT.resized_hw(H, W, 200, 300) == (200, 266)
    assert target["size"].tolist() == [200, 266] and target["orig_size"].tolist() == [H, W]
    # Val boxes are the annotation boxes, scaled: back to original pixels they match exactly.
    cx, cy, bw, bh = target["boxes"][0].tolist()
    np.testing.assert_allclose([(cx - bw / 2) * W, (cy - bh / 2) * H, bw * W, bh * H], RECTS[0][1:], atol=1e-3)
    # Normalisation: a black pixel becomes -mean/std.
    np.testing.assert_allclose(image[:, -1, 0].numpy(), (-MEAN / STD)[:, 0, 0], atol=1e-5)


def test_collate_pads_and_masks():
    a, b = torch.ones(3, 5, 7), torch.full((3, 6, 4), 2.0)
    ta, tb = {"image_id": 1}, {"image_id": 2}
    images, mask, targets = collate_detection([(a, ta), (b, tb)])
    assert images.shape == (2, 3, 6, 7) and mask.shape == (2, 6, 7) and mask.dtype == torch.bool
    assert targets == [ta, tb]
    assert torch.equal(images[0, :, :5, :7], a) and images[0, :, 5:].abs().sum() == 0
    assert torch.equal(images[1, :, :6, :4], b) and images[1, :, :, 4:].abs().sum() == 0
    assert not mask[0, :5].any() and mask[0, 5:].all()
    assert not mask[1, :, :4].any() and mask[1, :, 4:].all()
    images, mask, _ = collate_detection([(a, ta), (b, tb)], size_divisibility=32)
    assert images.shape[-2:] == (32, 32) and mask.shape[-2:] == (32, 32)
    assert mask[0].sum() == 32 * 32 - 5 * 7 and mask[1].sum() == 32 * 32 - 6 * 4


# ----------------------------------------------------------------------------------- bad inputs


def _img(tmp: Path, name="x.png", size=(50, 40)) -> dict:
    Image.fromarray(np.zeros((size[1], size[0], 3), np.uint8)).save(tmp / name)
    return {"id": 1, "file_name": name, "width": size[0], "height": size[1]}


def _ann(aid, bbox, image_id=1, cat=1, **kw) -> dict:
    return {"id": aid, "image_id": image_id, "category_id": cat, "bbox": bbox, "area": 1.0, "iscrowd": 0, **kw}


def test_malformed_json_names_file_line_and_column(tmp_path):
    ann = tmp_path / "broken.json"
    ann.write_text('{\n  "images": [],\n  "annotations": [,]\n}')
    with pytest.raises(AnnotationError, match=r"broken\.json: malformed JSON at line 3 column 19"):
        CocoDetection(tmp_path, ann)


def test_missing_top_level_keys(tmp_path):
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps({"images": []}))
    with pytest.raises(AnnotationError, match=r"a\.json: missing top-level key\(s\) \['annotations', 'categories'\]"):
        CocoDetection(tmp_path, ann)


def test_unknown_category_is_an_error_naming_the_annotation(tmp_path):
    ann = write_coco(tmp_path, [_img(tmp_path)], [_ann(1, [1, 1, 5, 5]), _ann(77, [1, 1, 5, 5], cat=9)])
    with pytest.raises(AnnotationError, match=r"ann\.json: annotation id 77 has category_id 9"):
        CocoDetection(tmp_path, ann)


def test_bbox_not_four_numbers_is_an_error(tmp_path):
    ann = write_coco(tmp_path, [_img(tmp_path)], [_ann(5, [1, 1, 5])])
    with pytest.raises(AnnotationError, match=r"annotation id 5 has bbox \[1, 1, 5\]"):
        CocoDetection(tmp_path, ann)


@pytest.mark.parametrize("where, field, value, message", [
    ("annotation", "iscrowd", "no", r"annotation id 5 has iscrowd 'no'; iscrowd is 0 or 1 \(1: a crowd region"),
    ("annotation", "iscrowd", None, r"annotation id 5 has iscrowd None"),
    ("annotation", "category_id", True, r"annotation id 5 has category_id True, a bool"),
    ("annotation", "category_id", 1.0, r"annotation id 5 has category_id 1\.0, a float"),
    ("annotation", "area", float("nan"), r"annotation id 5 has area nan; area is the object's size in pixels"),
    ("annotation", "area", "25", r"annotation id 5 has area '25'"),
    ("annotation", "id", 5.5, r"annotations\[0\] has id 5\.5, a float; annotation ids are unique integers"),
    ("image", "width", "abc", r"images\[0\] \('x\.png'\) has width 'abc'; width is the image's size in pixels"),
    ("image", "height", 0, r"images\[0\] \('x\.png'\) has height 0"),
    ("category", "name", ["c1"], r"categories\[0\] has name \['c1'\], a list; a category's name is text"),
])
def test_a_field_of_the_wrong_kind_is_an_error_naming_entry_field_and_fix(tmp_path, where, field, value, message):
    """Values that read as something else (a ``true`` category id as category 1, ``iscrowd: "no"`` as a crowd
    region, a NaN area in every size range) or stopped with a bare TypeError deep in the loader."""
    image, ann = _img(tmp_path), _ann(5, [1, 1, 5, 5])
    cats = [{"id": c, "name": f"c{c}"} for c in sorted(COLOURS)]
    {"annotation": ann, "image": image, "category": cats[0]}[where][field] = value
    path = write_coco(tmp_path, [image], [ann], categories=cats)
    with pytest.raises(AnnotationError, match=message):
        CocoDetection(tmp_path, path)


def test_fields_coco_allows_to_be_absent_or_boolean_are_read_as_coco_reads_them(tmp_path):
    """No iscrowd is 0, a null size is no size, ``iscrowd: true`` is a crowd region (as pycocotools takes it)."""
    image = dict(_img(tmp_path), width=None)
    plain = {k: v for k, v in _ann(5, [1, 1, 5, 5]).items() if k != "iscrowd"}
    ds = CocoDetection(tmp_path, write_coco(tmp_path, [image], [plain, _ann(6, [2, 2, 9, 9], iscrowd=True)]))
    assert ds.index.boxes[0].tolist() == [[1, 1, 5, 5]]
    assert ds.index.counts["crowd"] == 1


def test_images_left_without_a_box_are_kept_and_counted(tmp_path, caplog):
    """An image without annotations, or whose only ones are crowd or degenerate, trains as an image without
    objects (every query learns "no object"): kept, and counted in one line."""
    images = [dict(_img(tmp_path, f"{i}.png"), id=i) for i in (1, 2, 3)]
    anns = [_ann(1, [5, 5, 10, 10]), _ann(2, [1, 1, 30, 30], image_id=3, iscrowd=1)]
    ann = write_coco(tmp_path, images, anns)
    with caplog.at_level(logging.INFO, logger="visiontf.tasks.detection.coco_data"):
        ds = CocoDetection(tmp_path, ann)
    assert "2 of 3 image(s) have no box to train on" in caplog.text and "image ids [2, 3]" in caplog.text
    assert ds.index.counts["without_boxes"] == 2 and len(ds) == 3
    assert ds[1][1]["boxes"].shape == (0, 4)


def test_per_annotation_problems_are_counted_and_logged(tmp_path, caplog):
    anns = [
        _ann(1, [5, 5, 10, 10]),  # fine
        _ann(2, [5, 5, 10, 10], image_id=42), _ann(3, [5, 5, 10, 10], image_id=43),  # unknown images
        _ann(4, [5, 5, 0, 10]), _ann(5, [5, 5, 10, -1]), _ann(6, [5, float("nan"), 10, 10]),  # degenerate
        _ann(7, [45, 30, 20, 20]),  # reaches outside 50x40: clipped to [45, 30, 5, 10]
        _ann(8, [60, 5, 10, 10]),  # entirely outside
        _ann(9, [1, 1, 30, 30], iscrowd=1),  # crowd: evaluation only
    ]
    ann = write_coco(tmp_path, [_img(tmp_path)], anns)
    with caplog.at_level(logging.INFO, logger="visiontf.tasks.detection.coco_data"):
        ds = CocoDetection(tmp_path, ann)
    text = caplog.text
    assert "dropped 2 annotation(s) with an image_id not in 'images' (e.g. annotation ids [2, 3])" in text
    assert "dropped 3 annotation(s) with a degenerate bbox" in text and "[4, 5, 6]" in text
    assert "dropped 1 annotation(s) with a bbox entirely outside its image (e.g. annotation ids [8])" in text
    assert "clipped 1 annotation(s) with a bbox reaching outside its image (e.g. annotation ids [7])" in text
    assert "not training on 1 annotation(s) with iscrowd=1" in text
    assert ds.index.counts == {"unknown_image": 2, "degenerate": 3, "outside": 1, "clipped": 1, "crowd": 1,
                               "without_boxes": 0}
    assert ds.index.ann_ids[0].tolist() == [1, 7]
    np.testing.assert_allclose(ds.index.boxes[0], [[5, 5, 10, 10], [45, 30, 5, 10]])
    _, target = ds[0]
    assert target["boxes"].shape == (2, 4)
    np.testing.assert_allclose(target["boxes"][1].numpy(), [47.5 / 50, 35 / 40, 5 / 50, 10 / 40], atol=1e-6)


def test_missing_image_file_names_the_file(tmp_path):
    ann = write_coco(tmp_path, [{"id": 1, "file_name": "gone.jpg", "width": 10, "height": 10}], [])
    ds = CocoDetection(tmp_path, ann)
    with pytest.raises(ImageReadError, match=r"gone\.jpg: file not found"):
        ds[0]


def test_duplicate_image_ids_are_an_error(tmp_path):
    img = _img(tmp_path)
    ann = write_coco(tmp_path, [img, dict(img)], [])
    with pytest.raises(AnnotationError, match="image id 1 appears twice"):
        CocoDetection(tmp_path, ann)


def test_image_without_annotations_gives_empty_targets(tmp_path):
    ann = write_coco(tmp_path, [_img(tmp_path)], [])
    ds = CocoDetection(tmp_path, ann, DT.build_train_transforms(scales=[32], max_size=64, crop_scales=[40],
                                                                 crop_size=(20, 30), seed=0))
    for _ in range(4):
        image, target = ds[0]
        assert target["boxes"].shape == (0, 4) and target["boxes"].dtype == torch.float32
        assert target["labels"].shape == (0,) and target["labels"].dtype == torch.int64
        assert min(image.shape[1:]) == 32


# ------------------------------------------------------------------------- synthetic + datamodule


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("syn")
    t0 = time.perf_counter()
    paths = make_detection_dataset(root, num_train=16, num_val=8, seed=1, image_size=(96, 128))
    return paths, time.perf_counter() - t0


def test_synthetic_set_is_coco_and_deterministic(synthetic, tmp_path):
    paths, seconds = synthetic
    assert seconds < 5
    train = json.loads(paths["train_ann"].read_text())
    assert [c["id"] for c in train["categories"]] == [1, 2, 3, 5]
    per_image = {img["id"]: 0 for img in train["images"]}
    for a in train["annotations"]:
        per_image[a["image_id"]] += 1
        x, y, w, h = a["bbox"]
        img = next(i for i in train["images"] if i["id"] == a["image_id"])
        assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= img["width"] and y + h <= img["height"]
        assert a["iscrowd"] == 0 and a["category_id"] in {1, 2, 3, 5}
    assert 0 in per_image.values() and max(per_image.values()) <= 5
    assert any(a["bbox"][2] * a["bbox"][3] < 32 * 32 for a in train["annotations"])
    for img in train["images"][:3]:
        with Image.open(paths["train_images"] / img["file_name"]) as im:
            assert im.format == "JPEG" and im.size == (img["width"], img["height"])
    again = make_detection_dataset(tmp_path, num_train=16, num_val=8, seed=1, image_size=(96, 128))
    assert again["train_ann"].read_text() == paths["train_ann"].read_text()
    name = train["images"][0]["file_name"]
    digest = [hashlib.sha1((p / name).read_bytes()).hexdigest() for p in (paths["train_images"], again["train_images"])]
    assert digest[0] == digest[1]
    other = make_detection_dataset(tmp_path / "o", num_train=16, num_val=8, seed=2, image_size=(96, 128))
    assert other["train_ann"].read_text() != paths["train_ann"].read_text()


def test_datamodule_maps_categories_and_batches(synthetic):
    paths, _ = synthetic
    dm = CocoDataModule(paths["root"], batch_size=3, num_workers=0, scales=[64, 96], max_size=160,
                        crop_scales=[80], crop_size=(48, 80), val_size=80, size_divisibility=32)
    # Known before setup(): LightningCLI links num_classes into the model at instantiation.
    assert dm.num_classes == 4 and dm.class_names == ["circle", "square", "triangle", "star"]
    assert dm.label_to_cat_id == {0: 1, 1: 2, 2: 3, 3: 5} and dm.cat_id_to_label[5] == 3
    assert dm.val_ann_file == paths["val_ann"]
    assert dm.pin_memory == torch.cuda.is_available() and dm.persistent_workers is False
    dm.setup("fit")
    loader = dm.train_dataloader()
    # one process: an epoch-seeded single-replica sampler (exact resume); under DDP Lightning injects its own
    assert isinstance(loader.sampler, DistributedSampler) and loader.sampler.num_replicas == 1 and loader.sampler.shuffle
    images, mask, targets = next(iter(loader))
    assert images.shape[0] == 3 and images.shape[-1] % 32 == 0 and images.shape[-2] % 32 == 0
    for i, t in enumerate(targets):
        h, w = t["size"].tolist()
        assert not mask[i, :h, :w].any() and mask[i, h:].all() and mask[i, :, w:].all()
        assert (t["labels"] < 4).all()
    val = dm.val_dataloader()
    assert isinstance(val.sampler, SequentialSampler)
    val_ids, val_batches = [], 0
    for _, _, ts in val:  # (padded only to size_divisibility, alike for every image of a batch)
        assert len({tuple(t["size"].tolist()) for t in ts}) == 1, "an evaluation batch mixed image sizes"
        val_ids += [t["image_id"] for t in ts]
        val_batches += 1
    # every image once, grouped by size (so fewer full batches than in file order, never more images)
    assert sorted(val_ids) == sorted(img["id"] for img in json.loads(paths["val_ann"].read_text())["images"])
    assert val_batches == len(val)
    # Labels round-trip to the file's category ids.
    ds = dm.val_dataset
    for idx in range(len(ds)):
        anns = [a for a in json.loads(paths["val_ann"].read_text())["annotations"]
                if a["image_id"] == ds.index.images[idx]["id"]]
        assert sorted(dm.label_to_cat_id[int(l)] for l in ds[idx][1]["labels"]) == sorted(a["category_id"] for a in anns)
    dm.setup("predict")
    assert len(dm.predict_dataloader().dataset) == 8


def test_datamodule_rejects_splits_with_different_categories(synthetic, tmp_path):
    paths, _ = synthetic
    val = json.loads(paths["val_ann"].read_text())
    val["categories"] = val["categories"][:3]
    val["annotations"] = [a for a in val["annotations"] if a["category_id"] != 5]
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "instances_val2017.json").write_text(json.dumps(val))
    (tmp_path / "annotations" / "instances_train2017.json").write_text(paths["train_ann"].read_text())
    (tmp_path / "train2017").symlink_to(paths["train_images"])
    dm = CocoDataModule(tmp_path, num_workers=0)
    assert dm.num_classes == 3
    with pytest.raises(AnnotationError, match=r"category ids \[1, 2, 3, 5\] differ"):
        dm.setup("fit")


def test_datamodule_rejects_splits_naming_the_same_ids_differently(synthetic, tmp_path):
    """Same ids, two names swapped in one split: its labels would be trained or scored as the other split's classes."""
    paths, _ = synthetic
    val = json.loads(paths["val_ann"].read_text())
    names = {c["id"]: c["name"] for c in val["categories"]}
    for c in val["categories"]:
        c["name"] = {1: names[2], 2: names[1]}.get(c["id"], c["name"])
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "instances_val2017.json").write_text(json.dumps(val))
    (tmp_path / "annotations" / "instances_train2017.json").write_text(paths["train_ann"].read_text())
    (tmp_path / "train2017").symlink_to(paths["train_images"])
    dm = CocoDataModule(tmp_path, num_workers=0)
    with pytest.raises(AnnotationError, match=rf"instances_train2017\.json: category names differ from .*instances_val2017"
                                              rf"\.json for the same ids \(id 1: '{names[1]}' here, '{names[2]}' there; "
                                              rf"id 2: '{names[2]}' here, '{names[1]}' there\)"):
        dm.setup("fit")


def test_workers_draw_different_augmentations(rect_set):
    """Each DataLoader worker reseeds the pipeline; otherwise they would all copy one RNG."""
    root, ann = rect_set
    ds = CocoDetection(root, ann, DT.build_train_transforms(**SMALL, seed=0))
    ds.index.images = ds.index.images * 8
    for field in ("boxes", "labels", "ann_ids"):
        setattr(ds.index, field, getattr(ds.index, field) * 8)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2, collate_fn=collate_detection)
    sizes = [tuple(t[0]["size"].tolist()) + tuple(t[0]["boxes"][0].tolist()) for _, _, t in loader]
    # Worker 0 serves items 0, 2, 4, ... and worker 1 items 1, 3, 5, ...: their sequences must differ.
    assert sizes[0::2] != sizes[1::2]
    assert not math.isnan(sizes[0][2])


@pytest.mark.parametrize("name", ["/home/user/private.png", "../../private.png", "images/../../private.png",
                                  "C:\\Users\\u\\private.png", "\\\\server\\share\\private.png", 7])
def test_a_file_name_outside_the_image_folder_is_refused_naming_the_entry(tmp_path, name):
    """An annotation file is data: an absolute or climbing ``file_name`` had the dataset read (and the prediction
    pictures draw and log) a file of the user's that the dataset does not hold."""
    private = tmp_path / "private.png"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(private)
    root = tmp_path / "a" / "b"
    root.mkdir(parents=True)
    written = str(private) if isinstance(name, str) and name.startswith("/") else name
    ann = write_coco(root, [{"id": 1, "file_name": written, "width": 8, "height": 8}], [])
    with pytest.raises(AnnotationError, match=r"ann\.json: images\[0\]\.file_name is .*, (an absolute path|a path "
                                              r"through '\.\.'|not a file name); a dataset names its files relative"):
        CocoDetection(root, ann)


def test_file_names_in_subfolders_of_the_image_folder_load(tmp_path):
    (tmp_path / "sub").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "sub" / "a..b.png")
    ann = write_coco(tmp_path, [{"id": 1, "file_name": "sub/a..b.png", "width": 8, "height": 8}], [])
    image, _ = CocoDetection(tmp_path, ann)[0]
    assert image.shape[-2:] == (8, 8)
