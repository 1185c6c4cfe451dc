"""How this folder was made (run once; the tests only read its output).

    git -C /work/.mirror/CompVis+taming-transformers/repo archive HEAD data/coco_annotations_100 | tar -x -C /tmp/src
    python tests/data/coco_real/build_subset.py /tmp/src/data/coco_annotations_100

Copies a few images of CompVis/taming-transformers' ``data/coco_annotations_100`` (COCO 2017)
byte for byte, with their annotations unchanged, and the full 80-entry ``categories`` list so that
category ids stay COCO's (1..90 with gaps). None of the 200 images there carries an EXIF
Orientation tag, so one is added: ``val2017/000000013291_exif_orientation6.jpg`` holds the pixels of
val image 13291 turned a quarter turn counter-clockwise, tagged Orientation 6 ("rotate 90 degrees
clockwise to display"), as a phone writes a portrait photo; its annotation entry is the original one
(the displayed frame, 500 x 335). The unrotated original is copied to ``train2017`` (same image id
in the other split) so that tests can compare the two.

``boxes/instances_val2017_100.json`` holds the annotations of all 100 val images, unchanged but
without their ``segmentation`` polygons (box evaluation does not read them; 120 kB instead of 469 kB),
for the per-class COCO numbers' test (``tests/test_per_class_ap.py``); no image files.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from PIL import Image

HERE = Path(__file__).resolve().parent
#: split -> image ids copied as they are
PICKED = {
    "train2017": [
        10125,  # grayscale (mode L) JPEG; truck (8), clock (85)
        10136,  # 316 x 640, a crowd region among 15 boxes; book (84), clock (85)
        10395,  # 500 x 476; bed (65), teddy bear (88)
        10263,  # 500 x 375 without any annotation (COCO has such images)
    ],
    "val2017": [
        12670,  # 640 x 428, 29 boxes, a crowd region; ids 1, 27, 31, 77, 88
        10977,  # 500 x 375; toilet (70), sink (81)
    ],
}
EXIF_ID = 13291  # val2017, 500 x 335, CC BY 2.0 (license 4: derivatives allowed); person (1), frisbee (34)
EXIF_NAME = "000000013291_exif_orientation6.jpg"


def subset(data: dict, ids: list[int], licenses: list[dict]) -> dict:
    """``data`` restricted to the images ``ids`` (in that order) and their annotations; every category."""
    images = [dict(im) for i in ids for im in data["images"] if im["id"] == i]  # copies: renamed below
    used = {im["license"] for im in images}
    return {"info": data["info"], "licenses": [lic for lic in licenses if lic["id"] in used], "images": images,
            "annotations": [a for a in data["annotations"] if a["image_id"] in set(ids)],
            "categories": data["categories"]}


def main(src: Path) -> None:
    train = json.loads((src / "annotations" / "instances_train2017.json").read_text())
    val = json.loads((src / "annotations" / "instances_val2017.json").read_text())
    # the original of the EXIF image is added to train as it is (its id is unique within each file)
    both = {**train, "images": train["images"] + [im for im in val["images"] if im["id"] == EXIF_ID],
            "annotations": train["annotations"] + [a for a in val["annotations"] if a["image_id"] == EXIF_ID]}
    out = {"train2017": subset(both, PICKED["train2017"] + [EXIF_ID], val["licenses"]),
           "val2017": subset(val, PICKED["val2017"] + [EXIF_ID], val["licenses"])}
    exif_entry = next(im for im in val["images"] if im["id"] == EXIF_ID)
    for split, ids in (("train2017", PICKED["train2017"]), ("val2017", PICKED["val2017"])):
        (HERE / split).mkdir(parents=True, exist_ok=True)
        for i in ids:
            name = next(im["file_name"] for im in out[split]["images"] if im["id"] == i)
            shutil.copyfile(src / split / name, HERE / split / name)
    shutil.copyfile(src / "val2017" / exif_entry["file_name"], HERE / "train2017" / exif_entry["file_name"])
    original = Image.open(src / "val2017" / exif_entry["file_name"])
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the stored pixels must turn 90 degrees clockwise to be upright
    # ROTATE_90 is counter-clockwise: the stored (portrait) pixels, which exif_transpose turns back upright
    original.transpose(Image.Transpose.ROTATE_90).save(HERE / "val2017" / EXIF_NAME, quality=95, exif=exif)
    for im in out["val2017"]["images"]:
        if im["id"] == EXIF_ID:
            im["file_name"] = EXIF_NAME  # width/height stay the displayed 500 x 335
    (HERE / "annotations").mkdir(exist_ok=True)
    for split, data in out.items():
        (HERE / "annotations" / f"instances_{split}.json").write_text(json.dumps(data, separators=(",", ":")))
    write_boxes_only(val)


def write_boxes_only(val: dict) -> None:
    """All 100 val images' annotations without ``segmentation``, beside (not in) ``annotations/``, so no
    data module takes it for a split's file."""
    boxes = {**val, "annotations": [{k: v for k, v in a.items() if k != "segmentation"} for a in val["annotations"]]}
    (HERE / "boxes").mkdir(exist_ok=True)
    (HERE / "boxes" / "instances_val2017_100.json").write_text(json.dumps(boxes, separators=(",", ":")))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
