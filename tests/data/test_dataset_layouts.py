"""`--data.root` alone finds the layouts users bring: Roboflow/CVAT COCO exports and YOLO."""
import json

import numpy as np
import pytest
from handmade_data import CATEGORIES, make_dataset

from visiontf.core.errors import UserError
from visiontf.data.loading import DatasetLayoutError
from visiontf.tasks.detection.coco_annotations import AnnotationError, load_coco_json
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.detection_layouts import resolve_detection_layout
from visiontf.tasks.detection.yolo import convert_yolo, label_file, read_data_yaml

IDS = sorted(CATEGORIES)
NAMES = [CATEGORIES[c] for c in IDS]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VISIONTF_CACHE", str(tmp_path / "cache"))


def _boxes(dm: CocoDataModule, split: str) -> list[list[float]]:
    ann = load_coco_json(dm.train_ann_file if split == "train" else dm.val_ann_file)
    return sorted([round(v, 1) for v in a["bbox"]] for a in ann["annotations"])


def test_roboflow_export_with_its_supercategory_0(tmp_path):
    dm = CocoDataModule(make_dataset(tmp_path / "rf", "roboflow"), num_workers=0)
    assert dm.layout == "roboflow"
    assert dm.class_names == NAMES and dm.num_classes == 3  # category 0 ("shapes") is not a class
    assert dm.label_to_cat_id == dict(enumerate(IDS))
    assert dm.val_ann_file == tmp_path / "rf" / "valid" / "_annotations.coco.json"
    dm.setup("fit")
    assert len(dm.train_dataset) == 4 and len(dm.val_dataset) == 2


def test_roboflow_val_folder_and_missing_validation_split(tmp_path):
    root = make_dataset(tmp_path / "rf", "roboflow")
    (root / "valid").rename(root / "val")
    assert resolve_detection_layout(root).val_ann == root / "val" / "_annotations.coco.json"
    (root / "val" / "_annotations.coco.json").unlink()
    with pytest.raises(DatasetLayoutError, match="no valid/ or val/ split"):
        resolve_detection_layout(root)


def test_cvat_export(tmp_path):
    dm = CocoDataModule(make_dataset(tmp_path / "cvat", "cvat"), num_workers=0)
    assert dm.layout == "cvat" and dm.class_names == NAMES and dm.label_to_cat_id == dict(enumerate(IDS))
    assert dm.train_images == tmp_path / "cvat" / "images" / "Train"


def test_yolo_is_converted_to_the_same_boxes_with_class_indices_as_ids(tmp_path):
    coco_root = make_dataset(tmp_path / "coco", "coco", seed=3)
    yolo_root = make_dataset(tmp_path / "yolo", "yolo", seed=3)
    dm = CocoDataModule(yolo_root, num_workers=0)
    assert dm.layout == "yolo" and dm.class_names == NAMES
    assert dm.label_to_cat_id == {0: 0, 1: 1, 2: 2}  # YOLO's class indices are its category ids
    assert not any(p.suffix == ".json" for p in yolo_root.rglob("*"))  # the dataset folder is not written
    ref = CocoDataModule(coco_root, train_images="images/train", val_images="images/val",
                         train_ann="annotations/train.json", val_ann="annotations/val.json", num_workers=0)
    for split in ("train", "val"):
        np.testing.assert_allclose(_boxes(dm, split), _boxes(ref, split), atol=0.11)
    dm.setup("fit")
    image, target = dm.train_dataset[0]
    assert image.shape[0] == 3 and len(target["labels"]) >= 1


def test_yolo_data_yaml_forms_and_label_errors(tmp_path):
    root = make_dataset(tmp_path / "yolo", "yolo")
    (root / "data.yaml").write_text("path: .\ntrain: train/images\nval: valid/images\nnames: {0: circle, 1: square, 2: bar}\n")
    names, splits, _ = read_data_yaml(root / "data.yaml")
    assert names == NAMES and splits["val"] == [(root / "valid" / "images").resolve()]
    assert label_file(root / "train" / "images" / "a.jpg") == root / "train" / "labels" / "a.txt"

    label = next((root / "train" / "labels").glob("*.txt"))
    label.write_text("1 0.1 0.2 0.3 0.2 0.3 0.4\n")  # a polygon: its bounding box
    coco = json.loads(convert_yolo(root / "data.yaml", tmp_path / "out")["train"][1].read_text())
    img = next(i for i in coco["images"] if i["file_name"] == label.stem + ".jpg")
    box = next(a["bbox"] for a in coco["annotations"] if a["image_id"] == img["id"])
    np.testing.assert_allclose(box, [0.1 * 128, 0.2 * 96, 0.2 * 128, 0.2 * 96], atol=1e-3)

    label.write_text("5 0.5 0.5 0.1 0.1\n")
    with pytest.raises(AnnotationError, match=rf"{label.name}:1: class 5 is not in data.yaml's names \(0..2\)"):
        convert_yolo(root / "data.yaml", tmp_path / "out")
    label.write_text("0 0.5 0.5 0.1\n")
    with pytest.raises(AnnotationError, match=rf"{label.name}:1: expected 'class cx cy w h'"):
        convert_yolo(root / "data.yaml", tmp_path / "out")
    label.write_text("0 50 40 10 10\n")
    with pytest.raises(AnnotationError, match="normalised to 0..1"):
        convert_yolo(root / "data.yaml", tmp_path / "out")


@pytest.mark.parametrize("line, words", [
    ("1.5 0.5 0.5 0.1 0.1", r"class 1\.5 is not a class index; YOLO classes are integers 0\.\.2"),  # was class 1
    ("-0.5 0.5 0.5 0.1 0.1", r"class -0\.5 is not a class index"),  # was class 0
    ("inf 0.5 0.5 0.1 0.1", r"class inf is not a class index"),  # was an OverflowError
])
def test_yolo_class_ids_that_are_not_integers_are_refused_naming_file_and_line(tmp_path, line, words):
    root = make_dataset(tmp_path / "yolo", "yolo")
    label = sorted((root / "train" / "labels").glob("*.txt"))[0]
    label.write_text(f"0 0.5 0.5 0.2 0.2\n{line}\n")
    with pytest.raises(AnnotationError, match=rf"{label.name}:2: {words}"):
        convert_yolo(root / "data.yaml", tmp_path / "out")


def test_yolo_text_and_layout_mistakes_are_named_and_nothing_is_left_out_silently(tmp_path, caplog):
    root = make_dataset(tmp_path / "yolo", "yolo")
    labels = sorted((root / "train" / "labels").glob("*.txt"))
    first = labels[0].read_text().splitlines()[0]
    labels[0].write_bytes(b"\xef\xbb\xbf" + f"{first}\n".encode())  # a byte-order mark: read
    assert convert_yolo(root / "data.yaml", tmp_path / "out")
    labels[0].write_text(f"{first}\n", encoding="utf-16")
    with pytest.raises(AnnotationError, match=rf"{labels[0].name}: not UTF-8 text .*save it as UTF-8"):
        convert_yolo(root / "data.yaml", tmp_path / "out")
    labels[0].write_text(f"{first}\n0 0.5 0.5 0.0 0.2\n")  # a box of no width: dropped, naming file and line
    with caplog.at_level("WARNING"):
        coco = json.loads(convert_yolo(root / "data.yaml", tmp_path / "out")["train"][1].read_text())
    assert f"dropped 1 box(es) of zero or negative width or height, e.g. {labels[0]}:2" in caplog.text
    assert all(a["bbox"][2] > 0 for a in coco["annotations"])
    # an image of an extension that is not read: its label file is named, not left out without a word
    image = next(p for p in (root / "train" / "images").iterdir() if p.stem == labels[1].stem)
    image.rename(image.with_suffix(".jfif"))
    caplog.clear()
    with caplog.at_level("WARNING"):
        convert_yolo(root / "data.yaml", tmp_path / "out")
    assert f"1 label file(s) have no image and are not read, e.g. {labels[1]}" in caplog.text
    # a labels folder of another name: no image has a label file, which would train on no object
    (root / "train" / "labels").rename(root / "train" / "Labels")
    with pytest.raises(DatasetLayoutError, match=r"train/images: none of its \d+ images has a label file \(the first "
                                                 r"one's would be .*train/labels/.*\.txt\); YOLO labels lie in a 'labels'"):
        convert_yolo(root / "data.yaml", tmp_path / "out")


@pytest.mark.parametrize("names, words", [
    ("{0: circle, 1.5: square, 2: bar}", r"'names' keys must be class indices 0..K-1, got 1\.5"),
    ("{'0': circle, ' 1': square, '2': bar}", r"'names' keys must be class indices 0..K-1, got ' 1'"),
    ("[]", r"'names' is empty"),
])
def test_yolo_names_that_are_not_a_class_table_are_refused(tmp_path, names, words):
    root = make_dataset(tmp_path / "yolo", "yolo")
    (root / "data.yaml").write_text(f"path: .\ntrain: train/images\nval: valid/images\nnames: {names}\n")
    with pytest.raises(DatasetLayoutError, match=words):
        read_data_yaml(root / "data.yaml")


def test_root_errors_name_what_was_looked_for(tmp_path):
    with pytest.raises(DatasetLayoutError, match="dataset root not found") as info:
        CocoDataModule(tmp_path / "nope")
    assert isinstance(info.value, UserError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetLayoutError, match="looked for COCO .* Roboflow/CVAT export .* YOLO"):
        CocoDataModule(tmp_path / "empty")
