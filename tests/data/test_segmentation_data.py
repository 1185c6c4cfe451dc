"""Segmentation data: synthetic layouts, datasets, mmseg-style pipelines, bad input and the data module."""
from __future__ import annotations

import logging
from pathlib import Path

import albumentations as A
import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.tasks.classification.classification_data import DatasetLayoutError
from visiontf.tasks.segmentation.segmentation_data import (
    ADE20K_CLASSES,
    CITYSCAPES_CLASSES,
    CatMaxRatioCrop,
    LabelError,
    SegmentationDataModule,
    SegmentationDataset,
    ade20k_pairs,
    generic_pairs,
    keep_ratio_size,
    reduce_zero_label,
    segmentation_collate,
    segmentation_transforms,
)
from visiontf.tasks.segmentation.segmentation_synthetic import make_segmentation_dataset

SMALL = dict(num_train=6, num_val=3, num_classes=4, image_size=(48, 64))


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("seg")
    return {layout: make_segmentation_dataset(base / layout, layout=layout, **SMALL)
            for layout in ("generic", "ade20k", "cityscapes")}


def _bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generator_deterministic(tmp_path, roots):
    for layout, root in roots.items():
        assert _bytes(make_segmentation_dataset(tmp_path / layout, layout=layout, **SMALL)) == _bytes(root)
    assert _bytes(make_segmentation_dataset(tmp_path / "s1", seed=1, **SMALL)) != _bytes(roots["generic"])


def test_generator_layouts_agree(roots):
    """ADE20K annotations are the generic masks shifted by one with 0 where generic has 255."""
    g = np.array(Image.open(roots["generic"] / "masks" / "train" / "00000.png"))
    a = np.array(Image.open(roots["ade20k"] / "annotations" / "training" / "ADE_train_00000001.png"))
    c = np.array(Image.open(roots["cityscapes"] / "gtFine" / "train" / "aachen"
                            / "aachen_000000_000000_gtFine_labelTrainIds.png"))
    assert g.shape == (48, 64) and set(np.unique(g)) <= {0, 1, 2, 3, 255} and (g == 255).any()
    assert np.array_equal(a, np.where(g == 255, 0, g + 1))
    assert np.array_equal(reduce_zero_label(a), g)
    assert np.array_equal(c, g)
    assert (roots["generic"] / "classes.txt").read_text().splitlines()[0] == "background"


def test_reduce_zero_label_hand_made():
    mask = np.array([[0, 1, 2], [150, 255, 3]], np.uint8)
    assert reduce_zero_label(mask).tolist() == [[255, 0, 1], [149, 255, 2]]


@pytest.mark.parametrize("layout,expected_classes", [("generic", 4), ("ade20k", 4), ("cityscapes", 19)])
def test_each_layout_loads(roots, layout, expected_classes):
    dm = SegmentationDataModule(roots[layout], layout=layout, crop_size=32, base_size=(96, 48), batch_size=2,
                                val_batch_size=2, num_workers=0)
    # set before setup, for LightningCLI's data.num_classes -> model.num_classes link
    assert dm.num_classes == expected_classes and len(dm.class_names) == expected_classes
    assert dm.ignore_index == 255
    if layout == "cityscapes":
        assert dm.class_names == list(CITYSCAPES_CLASSES)
    dm.setup("fit")
    assert len(dm.train_dataset) == 6 and len(dm.val_dataset) == 3
    x, m = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 3, 32, 32) and x.dtype == torch.float32
    assert m.shape == (2, 32, 32) and m.dtype == torch.int64
    ok = (m == 255) | ((m >= 0) & (m < 4))
    assert ok.all()
    x, m = next(iter(dm.val_dataloader()))[:2]  # ADE20K / Cityscapes eval batches also carry sizes (mmseg's protocol)
    # val: keep-ratio resize of 48x64 to the (96, 48) scale -> 48x64 (short side bound), no crop
    assert x.shape == (2, 3, 48, 64) and m.shape == (2, 48, 64)
    assert set(m.unique().tolist()) <= {0, 1, 2, 3, 255}


def test_ade20k_dataset_reduces_labels(roots):
    pairs = ade20k_pairs(roots["ade20k"], "training")
    ds = SegmentationDataset(pairs, num_classes=4, reduce_zero_label=True)
    _, mask = ds[0]
    g = np.array(Image.open(roots["generic"] / "masks" / "train" / "00000.png"))
    assert np.array_equal(mask, g)


def test_ade20k_defaults_without_class_list(tmp_path, roots):
    root = make_segmentation_dataset(tmp_path / "ade", layout="ade20k", num_train=2, num_val=1, image_size=(32, 32))
    (root / "classes.txt").unlink()
    dm = SegmentationDataModule(root, layout="ade20k", num_workers=0)
    assert dm.num_classes == 150 and dm.class_names[0] == "wall" and dm.class_names == list(ADE20K_CLASSES)
    assert dm.train_split == "training" and dm.base_size == (2048, 512) and dm.reduce_zero_label


def test_images_of_another_case_or_extension_are_read_or_named(tmp_path, caplog):
    """ADE20K's images were found with a case-sensitive '*.jpg': a copy with .JPG names lost them with their masks; an
    image of an extension that is not read is named, not left out with its mask without a word."""
    root = make_segmentation_dataset(tmp_path / "ade", layout="ade20k", num_train=3, num_val=1, image_size=(32, 32))
    images = sorted((root / "images" / "training").iterdir())
    images[0].rename(images[0].with_suffix(".JPG"))
    assert len(ade20k_pairs(root, "training")) == 3
    images[1].rename(images[1].with_suffix(".jfif"))
    with caplog.at_level(logging.WARNING):
        assert len(ade20k_pairs(root, "training")) == 2
    assert f"1 file(s) not read as images, e.g. {images[1].stem}.jfif" in caplog.text


def test_keep_ratio_resize_matches_mmcv_rule():
    # mmcv rescale_size: factor = min(2048/400, 512/300) -> (512, int(400*1.70667+0.5)=683)
    assert keep_ratio_size(300, 400, (2048, 512)) == (512, 683)
    img = np.zeros((300, 400, 3), np.uint8)
    out = segmentation_transforms(train=False, base_size=(2048, 512))(image=img, mask=np.zeros((300, 400), np.uint8))
    assert tuple(out["image"].shape) == (3, 512, 683) and tuple(out["mask"].shape) == (512, 683)
    out = segmentation_transforms(train=False, val_resize=False)(image=img, mask=np.zeros((300, 400), np.uint8))
    assert tuple(out["image"].shape) == (3, 300, 400)


PALETTE = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]], np.uint8)


def _colour_coded(h: int = 40, w: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Asymmetric stripes (so an unflipped mask would disagree) and a block; colour = PALETTE[label]."""
    mask = np.zeros((h, w), np.uint8)
    mask[:, 5:12] = 1
    mask[:, 30:50] = 2
    mask[h // 2:, 20:28] = 3
    return PALETTE[mask], mask


def test_train_pipeline_keeps_image_and_mask_aligned():
    image, mask = _colour_coded()
    t = segmentation_transforms(train=True, crop_size=48, base_size=(60, 40), photometric=False,
                                mean=(0, 0, 0), std=(1, 1, 1), seed=0)
    padded = flipped = 0
    for _ in range(25):
        out = t(image=image, mask=mask)
        img = (out["image"].permute(1, 2, 0).numpy() * 255).round()  # back to 0..255
        m = np.asarray(out["mask"]).astype(int)
        assert img.shape == (48, 48, 3) and m.shape == (48, 48)
        pad = m == 255
        # the source has no 255 labels, so every 255 is padding: image 0 there, bottom/right only
        assert (img[pad] == 0).all()
        padded += int(pad.any())
        if pad.any():
            rows, cols = np.where(~pad)
            assert pad[rows.max() + 1:, :].all() and pad[:, cols.max() + 1:].all()
        decoded = np.argmin(((img[:, :, None, :] - PALETTE[None, None].astype(float)) ** 2).sum(-1), axis=-1)
        # bilinear (image) and nearest (mask) resizing may differ by a pixel at label edges: compare the
        # interior, pixels whose 5x5 neighbourhood has one label (crop borders excluded: an edge may lie just outside)
        padded_m = np.pad(m, 2, constant_values=-1)
        windows = np.lib.stride_tricks.sliding_window_view(padded_m, (5, 5))
        interior = (windows.min(axis=(-1, -2)) == windows.max(axis=(-1, -2))) & ~pad
        assert interior.sum() > 100
        assert (decoded == m)[interior].mean() > 0.99
        # a misaligned mask (e.g. not flipped with the image) would fail the same check
        assert (decoded == m[:, ::-1])[interior & ~pad[:, ::-1]].mean() < 0.9 or not (m == 1).any()
        # stripe of class 1 lies left of class 2 in the source; flipped crops reverse that
        c1, c2 = np.where(m == 1)[1], np.where(m == 2)[1]
        if len(c1) and len(c2):
            flipped += int(c1.mean() > c2.mean())
    assert padded > 0 and flipped > 0  # both branches exercised


def test_pad_fills_image_zero_and_mask_255():
    image, mask = _colour_coded(20, 30)
    t = segmentation_transforms(train=True, crop_size=(32, 48), base_size=(30, 20), ratio_range=(1.0, 1.0),
                                hflip=0.0, photometric=False, seed=0)
    out = t(image=image, mask=mask)
    assert tuple(out["image"].shape) == (3, 32, 48)
    m = np.asarray(out["mask"])
    assert (m[20:, :] == 255).all() and (m[:, 30:] == 255).all() and np.array_equal(m[:20, :30], mask)
    assert (out["image"][:, 20:, :] == 0).all() and (out["image"][:, :, 30:] == 0).all()


def _ratio(m: np.ndarray) -> float:
    labels, counts = np.unique(m, return_counts=True)
    counts = counts[labels != 255]
    return counts.max() / counts.sum() if len(counts) > 1 else 1.0


def test_cat_max_ratio_honoured():
    # class 2 fills the left half: a 50-wide crop passes only for x offsets in (12.5, 37.5), ~half of all draws.
    # An ignore band over the right quarter must not count (counting it as a class would change the ratios).
    mask = np.ones((100, 100), np.uint8)
    mask[:, :50] = 2
    mask[:, 80:] = 255
    image = np.zeros((100, 100, 3), np.uint8)
    ratios = {}
    for cmr in (0.75, 1.0):
        t = A.Compose([CatMaxRatioCrop(50, 50, cat_max_ratio=cmr)], seed=0)
        ratios[cmr] = [_ratio(t(image=image, mask=mask)["mask"]) for _ in range(30)]
    assert max(ratios[0.75]) < 0.75
    assert sum(r >= 0.75 for r in ratios[1.0]) >= 5  # without the rule, dominated crops are common
    crop = CatMaxRatioCrop(50, 50)
    assert not crop.passes(mask, (0, 0, 50, 50))  # one class only
    assert crop.passes(mask, (30, 0, 80, 50))  # 20 vs 30 columns of classes 2 and 1 -> 0.6
    # 10 columns of 2, 30 of 1, 10 ignored: 30/40 = 0.75 fails; counting ignore would give 30/50 = 0.6
    assert not crop.passes(mask, (40, 0, 90, 50))


def test_val_collate_pads_masks_with_255():
    a = (torch.ones(3, 4, 5), torch.zeros(4, 5, dtype=torch.int64))
    b = (torch.ones(3, 6, 3), torch.ones(6, 3, dtype=torch.int64))
    images, masks = segmentation_collate([a, b])
    assert images.shape == (2, 3, 6, 5) and masks.shape == (2, 6, 5) and masks.dtype == torch.int64
    assert (masks[0, 4:] == 255).all() and (masks[1, :, 3:] == 255).all() and (masks[0, :4] == 0).all()
    assert (images[0, :, 4:] == 0).all() and (images[1, :, :, 3:] == 0).all()


def test_val_batches_of_different_sizes(tmp_path):
    root = tmp_path / "mixed"
    for i, (h, w) in enumerate([(20, 30), (30, 20)]):
        for sub, arr in (("images", np.zeros((h, w, 3), np.uint8)), ("masks", np.ones((h, w), np.uint8))):
            (root / sub / "val").mkdir(parents=True, exist_ok=True)
            Image.fromarray(arr).save(root / sub / "val" / f"{i}.png")
    (root / "classes.txt").write_text("bg\nfg\n")
    (root / "images" / "val" / "2.png").write_bytes((root / "images" / "val" / "0.png").read_bytes())
    (root / "masks" / "val" / "2.png").write_bytes((root / "masks" / "val" / "0.png").read_bytes())
    dm = SegmentationDataModule(root, val_batch_size=2, num_workers=0, val_resize=False)
    dm.setup("validate")
    # evaluation batches hold one size each (padding would reach the model: scores moved with the batch size)
    loader = dm.val_dataloader()
    assert [tuple(x.shape) for x, _ in loader] == [(2, 3, 20, 30), (1, 3, 30, 20)]
    # the collate still pads what it is given: images with 0, masks with ignore
    x, m = loader.collate_fn([dm.val_dataset[0], dm.val_dataset[1]])
    assert x.shape == (2, 3, 30, 30) and (m[0, 20:] == 255).all() and (m[1, :, 20:] == 255).all()


# ---- bad input -------------------------------------------------------------------------------

def _generic(root: Path, masks: dict[str, np.ndarray], image_hw: tuple[int, int] = (8, 8)) -> Path:
    (root / "images" / "train").mkdir(parents=True)
    (root / "masks" / "train").mkdir(parents=True)
    for name, mask in masks.items():
        Image.fromarray(np.zeros((*image_hw, 3), np.uint8)).save(root / "images" / "train" / f"{name}.jpg")
        if mask is not None:
            Image.fromarray(mask).save(root / "masks" / "train" / f"{name}.png")
    (root / "classes.txt").write_text("bg\na\nb\n")
    return root


def test_size_mismatch_names_both_files(tmp_path):
    root = _generic(tmp_path, {"x": np.zeros((6, 8), np.uint8)})
    ds = SegmentationDataset(generic_pairs(root, "train"), num_classes=3)
    with pytest.raises(DatasetLayoutError, match=r"images/train/x\.jpg is 8x8 \(WxH\) but its mask .*masks/train/x\.png is 8x6"):
        ds[0]


def test_out_of_range_labels_mapped_with_warning_or_strict_error(tmp_path, caplog):
    mask = np.zeros((8, 8), np.uint8)
    mask[0, :3] = [7, 9, 255]
    root = _generic(tmp_path, {"x": mask})
    ds = SegmentationDataset(generic_pairs(root, "train"), num_classes=3)
    with caplog.at_level(logging.WARNING):
        _, out = ds[0]
        ds[0]
    assert out[0, :3].tolist() == [255, 255, 255] and (out[1:] == 0).all()
    assert caplog.text.count("x.png: 2 pixel(s) with labels [7, 9] outside [0, 3)") == 1  # once per file
    assert ds.bad_label_pixels == 2 and len(ds.bad_label_files) == 1
    strict = SegmentationDataset(generic_pairs(root, "train"), num_classes=3, strict=True)
    with pytest.raises(LabelError, match=r"masks/train/x\.png: labels \[7, 9\] outside \[0, 3\)"):
        strict[0]


def test_binary_masks_saved_as_0_and_255_are_refused_naming_the_fix(tmp_path):
    """255 is the ignore value: the foreground of such masks was never trained on, and a validation split of them
    scored mIoU 1.000 without a word. A split showing two classes in its first mask costs one mask's read."""
    masks = {}
    for i in range(5):
        mask = np.zeros((8, 8), np.uint8)
        mask[i:i + 3, 2:6] = 255
        masks[f"m{i}"] = mask
    root = _generic(tmp_path / "binary", masks)
    (root / "classes.txt").write_text("background\nforeground\n")
    dm = SegmentationDataModule(root, val_split="train", num_workers=0)
    with pytest.raises(LabelError, match=r"masks/train: all 5 train masks hold class 0 \(background\) "
                                         r"and no other of the 2 classes; \d+% of their pixels are 255, the ignore value: "
                                         r"binary masks saved as 0/255\? Save the foreground as its class index"):
        dm.setup("fit")
    # the foreground as 1 in the last mask alone (a rare class): read until it turns up, accepted
    Image.fromarray((masks["m4"] == 255).astype(np.uint8)).save(root / "masks" / "train" / "m4.png")
    SegmentationDataModule(root, val_split="train", num_workers=0).setup("fit")


def test_class_lists_of_other_encodings_or_too_many_classes_are_one_line(tmp_path):
    root = _generic(tmp_path / "g", {"a": np.array([[0, 1], [2, 0]], np.uint8)}, image_hw=(2, 2))
    (root / "classes.txt").write_bytes(b"\xef\xbb\xbfbg\na\nb\n")  # a byte-order mark is no part of the first name
    assert SegmentationDataModule(root, num_workers=0).class_names == ["bg", "a", "b"]
    (root / "classes.txt").write_bytes("b\u00e9g\na\nb\n".encode("latin-1"))
    with pytest.raises(DatasetLayoutError, match=r"classes\.txt: not UTF-8 text .*save it as UTF-8"):
        SegmentationDataModule(root, num_workers=0)
    (root / "classes.txt").write_text("".join(f"c{k}\n" for k in range(300)))
    with pytest.raises(DatasetLayoutError, match=r"300 classes \(classes\.txt's lines, or num_classes\): masks hold 8-bit "
                                                 r"labels .* 1\.\.255 classes"):
        SegmentationDataModule(root, val_split="train", num_workers=0).setup("fit")


def test_missing_mask_names_expected_path(tmp_path):
    root = _generic(tmp_path, {"a": np.zeros((8, 8), np.uint8), "b": None})
    with pytest.raises(DatasetLayoutError, match=r"images/train/b\.jpg: mask not found, expected .*masks/train/b\.png"):
        generic_pairs(root, "train")


def test_missing_split_and_class_list_errors(tmp_path, roots):
    with pytest.raises(DatasetLayoutError, match=r"images/validation: split folder not found"):
        SegmentationDataModule(roots["generic"], val_split="validation", num_workers=0).setup("validate")
    root = _generic(tmp_path / "g", {"a": np.zeros((8, 8), np.uint8)})
    (root / "classes.txt").unlink()
    with pytest.raises(DatasetLayoutError, match=r"classes\.txt: class list not found"):
        SegmentationDataModule(root)
    assert SegmentationDataModule(root, num_classes=3).class_names == ["class_0", "class_1", "class_2"]
    (root / "classes.txt").write_text("bg\nfg\n")
    with pytest.raises(DatasetLayoutError, match="lists 2 classes but num_classes=5"):
        SegmentationDataModule(root, num_classes=5)


def test_cityscapes_missing_label_ids_hint(tmp_path, roots):
    import shutil

    root = tmp_path / "cs"
    shutil.copytree(roots["cityscapes"], root)
    victim = next((root / "gtFine" / "val").rglob("*_labelTrainIds.png"))
    victim.unlink()
    with pytest.raises(DatasetLayoutError, match=rf"{victim.name}.*createTrainIdLabelImgs"):
        SegmentationDataModule(root, layout="cityscapes", num_workers=0).setup("validate")
