"""Bad input: each case ends in a converted image or a clear error naming the file (docs/robustness.md).

Cases already covered elsewhere are listed in docs/robustness.md with their test names and not repeated.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from visiontf.data.io import ImageReadError, read_image

ROOT = Path(__file__).resolve().parents[2]


def _png(path: Path, size=(12, 8)) -> Path:
    Image.fromarray(np.full((size[1], size[0], 3), 80, np.uint8)).save(path, format="PNG")
    return path


def test_zero_byte_file_is_a_clear_error(tmp_path):
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(ImageReadError, match=r"empty\.jpg: file is empty \(0 bytes\)"):
        read_image(tmp_path / "empty.jpg")


def test_png_named_jpg_loads_and_text_named_jpg_is_a_clear_error(tmp_path):
    arr = read_image(_png(tmp_path / "really_png.jpg"))
    assert arr.shape == (8, 12, 3) and (arr == 80).all()
    (tmp_path / "notes.jpg").write_text("not an image\n")
    with pytest.raises(ImageReadError, match=r"notes\.jpg: not a readable image"):
        read_image(tmp_path / "notes.jpg")


def test_cmyk_jpeg_becomes_rgb(tmp_path):
    Image.new("CMYK", (10, 6), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg")  # pure red in CMYK
    arr = read_image(tmp_path / "cmyk.jpg")
    assert arr.shape == (6, 10, 3) and arr.dtype == np.uint8
    assert arr[..., 0].mean() > 200 and arr[..., 1].mean() < 60 and arr[..., 2].mean() < 60


def test_exif_rotated_jpeg_is_read_upright(tmp_path):
    img = np.zeros((20, 40, 3), np.uint8)
    img[:, :20] = 255  # left half white as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    Image.fromarray(img).save(tmp_path / "rot.jpg", exif=exif, quality=95)
    arr = read_image(tmp_path / "rot.jpg")
    assert arr.shape == (40, 20, 3)  # displayed portrait
    assert arr[:20].mean() > 200 and arr[20:].mean() < 50  # stored left half is displayed on top


def test_decompression_bomb_is_a_clear_error(tmp_path, monkeypatch):
    import PIL.Image

    _png(tmp_path / "huge.png", size=(100, 100))
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow errors above twice the limit
    with pytest.raises(ImageReadError, match=r"huge\.png: image larger than the decompression-bomb limit"):
        read_image(tmp_path / "huge.png")


@pytest.mark.slow
def test_error_in_dataloader_worker_names_the_file(tmp_path):
    """A worker process's exception reaches the user as the same type, with the file name in the message."""
    from torch.utils.data import DataLoader

    from visiontf.tasks.classification.classification_data import ImageFolderDataset

    (tmp_path / "a").mkdir()
    _png(tmp_path / "a" / "ok.png")
    (tmp_path / "a" / "zz_broken.jpg").write_text("oops")
    loader = DataLoader(ImageFolderDataset(tmp_path), batch_size=1, num_workers=1)
    with pytest.raises(ImageReadError) as err:
        list(loader)
    assert "zz_broken.jpg: not a readable image" in str(err.value)
    assert "DataLoader worker process 0" in str(err.value)


def test_missing_annotation_file_is_a_clear_error(tmp_path):
    from visiontf.tasks.detection.coco_annotations import AnnotationError, load_coco_json

    with pytest.raises(AnnotationError, match=r"instances_val\.json: annotation file not found"):
        load_coco_json(tmp_path / "instances_val.json")


def test_empty_coco_split_is_reported(tmp_path):
    from visiontf.tasks.detection.coco_annotations import AnnotationError
    from visiontf.tasks.detection.coco_dataset import CocoDetection

    ann = tmp_path / "empty.json"
    ann.write_text(json.dumps({"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
    with pytest.raises(AnnotationError, match=r"empty\.json: 'images' is empty"):
        CocoDetection(tmp_path, ann)


def _torch_load_calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "load" and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"]


def test_every_torch_load_in_the_library_is_weights_only():
    """Checkpoints and weight files are read without unpickling arbitrary objects (see also
    tests/models/vit/test_vit.py::test_malicious_pickle_is_refused)."""
    files = [p for d in ("visiontf", "tools", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
    calls = [(p, c) for p in files for c in _torch_load_calls(p)]
    assert calls, "no torch.load call found; the audit is looking in the wrong place"
    unsafe = []
    for path, call in calls:
        kw = {k.arg: k.value for k in call.keywords}
        if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
            unsafe.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert not unsafe, f"torch.load without weights_only=True: {unsafe}"


def test_only_the_allow_list_reads_torch_files_in_the_library():
    """Inside visiontf every .pth/.ckpt is read by visiontf.io.weights.safe_torch_load (the one allow-list, the
    corrupt-file messages); a plain torch.load elsewhere refuses what the allow-list takes and names nothing."""
    files = sorted((ROOT / "visiontf").rglob("*.py"))
    elsewhere = [f"{p.relative_to(ROOT)}:{c.lineno}" for p in files if p != ROOT / "visiontf" / "io" / "weights.py" for c in _torch_load_calls(p)]
    assert not elsewhere, f"torch.load outside visiontf/io/weights.py (use safe_torch_load): {elsewhere}"
    assert _torch_load_calls(ROOT / "visiontf" / "io" / "weights.py")


def test_image_size_reads_only_the_header_of_a_png_and_keeps_the_one_limit(tmp_path, monkeypatch):
    """A PNG's ``getexif`` decoded the whole image to look for a late eXIf chunk (2.4 s and 310 MB on a 324-Mpx
    upload); the size and orientation come from the header, and the limit applies at 1x, as read_image's."""
    from PIL import ImageFile

    from visiontf.data import io as vio

    rotated = Image.new("RGB", (40, 20))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: shown 20 wide, 40 high
    rotated.save(tmp_path / "rotated.png", exif=exif)
    Image.new("L", (300, 200)).save(tmp_path / "plain.png")

    def no_decoding(self):
        raise AssertionError("image_size decoded the pixels")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    assert vio.image_size(tmp_path / "rotated.png") == (20, 40)
    assert vio.image_size(tmp_path / "plain.png") == (300, 200)
    monkeypatch.setattr(vio, "MAX_IMAGE_PIXELS", 300 * 200 - 1)
    with pytest.raises(ImageReadError, match=r"plain\.png: image larger than the decompression-bomb limit of 59,999 pixels"):
        vio.image_size(tmp_path / "plain.png")


_EPS = (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n"
        b"/marker (payload) def\nshowpage\n%%EOF\n")


def test_an_eps_file_never_reaches_ghostscript(tmp_path, monkeypatch):
    """Pillow identifies a file by its content and reads EPS by running Ghostscript on its PostScript: an image
    named .jpg that is EPS is refused as unreadable by every reader, and Ghostscript is never started."""
    from PIL import EpsImagePlugin, UnidentifiedImageError

    from visiontf.cli.app import check_image_header
    from visiontf.data.io import image_size
    from visiontf.io.image_files import open_image
    from visiontf.tasks.restoration.restoration_files import ImageReadError as RestorationReadError
    from visiontf.tasks.restoration.restoration_files import read_rgb8

    started = []
    monkeypatch.setattr(EpsImagePlugin, "has_ghostscript", lambda: True)
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", lambda *a, **k: started.append(a))
    path = tmp_path / "photo.jpg"
    path.write_bytes(_EPS)
    with Image.open(path) as img:  # what Pillow alone makes of it
        assert img.format == "EPS"
    with pytest.raises(UnidentifiedImageError):
        open_image(path)
    with pytest.raises(ImageReadError, match=r"photo\.jpg: not a readable image"):
        read_image(path)
    with pytest.raises(ImageReadError, match=r"photo\.jpg"):
        image_size(path)
    with pytest.raises(RestorationReadError, match=r"photo\.jpg: cannot decode"):
        read_rgb8(path)
    assert check_image_header(path) is not None
    assert started == []


def test_every_pillow_open_in_the_library_goes_through_open_image():
    """The one place that says which formats an image file may be read as (visiontf.io.image_files)."""
    files = sorted((ROOT / "visiontf").rglob("*.py"))
    opens = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in files if p != ROOT / "visiontf" / "io" / "image_files.py"
             for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "open" and isinstance(n.func.value, ast.Name) and n.func.value.id == "Image"]
    assert not opens, f"Image.open outside visiontf/io/image_files.py (use open_image): {opens}"
