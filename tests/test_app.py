"""The local web app (``tools/app.py``, visiontf/cli/app.py): what it shows for every task, then the real server
in a real browser.

The browser test starts ``tools/app.py`` as a subprocess (Gradio's own server, nothing mocked) on a free
port and drives Debian's headless ``chromium`` through ``chromedriver`` with Selenium (the driver is the
system's: Selenium Manager, which would download one and send usage statistics, is never called). It drops
an image, reads the result off the page, moves the score slider, downloads the JSON, runs a batch, saves a
screenshot (``VISIONTF_KEEP_SCREENSHOTS=DIR`` keeps the screenshots there, to look at), and checks from
the browser's own network log that the page loaded nothing from anywhere but
the app (no fonts or scripts from a CDN). CI installs chromium with apt (``.ci/run``); without it this test
fails, naming what to install.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from ddp_utils import ROOT, free_port, subprocess_env
from PIL import Image

import visiontf
from visiontf.inference import Predictor

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def image_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("app") / "shapes.png"
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
    pixels[10:30, 12:36] = (200, 60, 40)
    Image.fromarray(pixels).save(path)
    return path


def _app(model: torch.nn.Module):
    from visiontf.cli.app import AppModel

    return AppModel(Predictor(model.eval(), device="cpu"))


def test_detection_page_content_and_the_slider_filter(image_file):
    app = _app(visiontf.create_model("detr_tiny", num_classes=3, enc_layers=1, dec_layers=1, num_queries=7))
    assert app.filters_by_score
    (item,) = app.predict([str(image_file)])
    assert app.picture(item, 0.5).shape == (384, 461, 3)  # enlarged to a shorter side of 384: legible labels
    every = app.record(item, 0.0)["detections"]
    assert len(every) == 7 and [d["score"] for d in every] == sorted((d["score"] for d in every), reverse=True)
    middle = float(np.median([d["score"] for d in every]))
    assert len(app.record(item, middle)["detections"]) == sum(d["score"] > middle for d in every) < 7
    assert app.record(item, 0.999)["detections"] == [] and "0 detections" in app.describe([item], 0.999)
    assert not np.array_equal(app.picture(item, 0.0), app.picture(item, 0.999))  # boxes drawn, then none
    assert app.top_classes(item) is None
    json.dumps(app.record(item, 0.0))


def test_every_other_task_has_a_picture_a_record_and_a_summary(image_file):
    from pycocotools import mask as mask_utils

    cls = _app(visiontf.create_model("vit_tiny_patch16_224", num_classes=5, img_size=32, depth=1))
    (item,) = cls.predict([str(image_file)])
    top = cls.top_classes(item)
    assert len(top) == 5 and sum(top.values()) == pytest.approx(1, abs=1e-4)
    assert [c["score"] for c in cls.record(item, 0.5)["top_classes"]] == [round(v, 4) for v in top.values()]

    seg = _app(visiontf.create_model("setr_naive_vit_tiny_patch16", num_classes=3, img_size=32, encoder_kwargs={"depth": 4}))
    (item,) = seg.predict([str(image_file)])
    record = seg.record(item, 0.5)
    assert sum(c["pixels"] for c in record["classes"]) == 40 * 48
    for c in record["classes"]:  # each mask is COCO's RLE of that class's pixels
        rle = {"size": c["mask_rle"]["size"], "counts": c["mask_rle"]["counts"].encode()}
        assert np.array_equal(mask_utils.decode(rle).astype(bool), (item.result["label_map"] == c["label"]).numpy())
    assert seg.picture(item, 0.5).shape == (40, 48, 3) and "classes:" in seg.describe([item], 0.5)

    res = _app(visiontf.create_model("ipt_tiny", n_feats=4, patch_dim=4, num_heads=2, num_layers=1, tile_size=16))
    (item,) = res.predict([str(image_file)])
    assert res.record(item, 0.5) == {"file": "shapes.png", "task": "sr_x2", "output_size": [80, 96]}
    h, w, _ = res.picture(item, 0.5).shape
    assert w == 2 * 96 + 8 and h > 80  # input (enlarged) | restored, each under its title

    gen = _app(visiontf.create_model("vqgan_tiny", ch=32, ch_mult=[1, 2], num_res_blocks=1, attn_resolutions=[],
                                     n_embed=16, embed_dim=4))
    (item,) = gen.predict([str(image_file)])
    assert gen.picture(item, 0.5).shape == (40, 96, 3)  # original | reconstruction
    assert gen.record(item, 0.5)["codes_shape"] == [20, 24] and "PSNR" in gen.describe([item], 0.5)


def test_the_page_builds_without_launching(image_file):
    from visiontf.cli.app import build_app

    page = build_app(_app(visiontf.create_model("detr_tiny", num_classes=3, enc_layers=1, dec_layers=1)), 0.3)
    ids = {getattr(block, "elem_id", None) for block in page.blocks.values()}
    assert {"input_image", "result_image", "summary", "predictions", "download", "score_threshold", "gallery"} <= ids


def test_command_line_mistakes_are_one_line():
    proc = subprocess.run([sys.executable, "tools/app.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--ckpt_path" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "tools/app.py", "--ckpt_path", "nope.ckpt"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "nope.ckpt" in proc.stderr


# -- the real server in a real browser -------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``tools/app.py --weights`` of an exported tiny DETR whose boxes sit near the image centre."""
    from visiontf.io.weights import save_model, write_labels_file

    tmp = tmp_path_factory.mktemp("app_server")
    torch.manual_seed(0)
    model = visiontf.create_model("detr_tiny", num_classes=2, enc_layers=1, dec_layers=1, num_queries=6, hidden_dim=32,
                                  nheads=2, dim_feedforward=64)
    with torch.no_grad():  # boxes near the centred half of the image (sigmoid(0) = 0.5), a little apart
        model.bbox_embed.layers[2].weight.mul_(0.05)
        model.bbox_embed.layers[2].bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.0]))
    weights = save_model(model, tmp / "detr.safetensors")
    write_labels_file(weights, class_names=["circle", "square"], preprocess={"min_size": 64, "max_size": 96})
    port = free_port()
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("GRADIO_")}  # the app must set them itself
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "tools/app.py", "--weights", str(weights), "--port", str(port)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"tools/app.py exited {proc.returncode}: {(tmp / 'server.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        raise AssertionError(f"tools/app.py did not answer in 180 s: {(tmp / 'server.log').read_text()[-3000:]}")
    yield {"url": url, "port": port, "tmp": tmp, "log": tmp / "server.log"}
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture(scope="module")
def browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    assert not missing, (f"{missing} not found: the web app's test needs Debian's chromium and chromedriver "
                         "(apt-get install -y chromium chromium-driver; .ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium_profile_")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1300", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _wait(driver, what, timeout: float = 120):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.5).until(what)


def _text(driver, css: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css).get_attribute("value") or ""


@pytest.mark.slow
def test_the_app_answers_in_a_headless_browser(server, browser, image_file, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(server["url"])
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#input_image input[type=file]"))
    browser.find_element(By.CSS_SELECTOR, "#input_image input[type=file]").send_keys(str(image_file))
    summary = _wait(browser, lambda d: _text(d, "#summary textarea"))
    assert summary.startswith("shapes.png: ") and "detection" in summary, summary

    # the slider at 0 shows every detection (the model keeps 6 queries), redrawn without a model run
    box = browser.find_element(By.CSS_SELECTOR, "#score_threshold input[type=number]")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("0", Keys.ENTER)
    every = _wait(browser, lambda d: (t := _text(d, "#summary textarea")) != summary and t)
    assert "6 detections with score > 0.00" in every, every
    # the download is the JSON the page shows, with every detection
    link = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#download a[href]"))[0].get_attribute("href")
    with urllib.request.urlopen(link, timeout=30) as r:
        payload = json.loads(r.read())
    assert payload["file"] == "shapes.png" and payload["score_threshold"] == 0.0 and len(payload["detections"]) == 6
    assert {d["class_name"] for d in payload["detections"]} <= {"circle", "square"}
    assert all(0 <= d["box_xyxy"][0] <= d["box_xyxy"][2] <= 48 for d in payload["detections"])
    result = browser.find_element(By.CSS_SELECTOR, "#result_image img")
    assert result.get_attribute("naturalWidth") == "461" and result.get_attribute("naturalHeight") == "384"
    shot = server["tmp"] / "app_one_image.png"
    browser.save_screenshot(str(shot))

    # a batch: two files, a gallery of two results, one summary line each
    browser.find_element(By.XPATH, "//button[@role='tab' and contains(., 'Batch')]").click()
    second = tmp_path / "second.png"
    Image.fromarray(np.asarray(Image.open(image_file))[::-1].copy()).save(second)
    field = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#batch_files input[type=file]"))[0]
    field.send_keys(f"{image_file}\n{second}")
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#batch_files .file-preview tr, #batch_files table tr")) >= 2
          or "second.png" in d.find_element(By.CSS_SELECTOR, "#batch_files").text)
    browser.find_element(By.CSS_SELECTOR, "#run_batch").click()
    lines = _wait(browser, lambda d: (t := _text(d, "#batch_summary textarea")).count("\n") == 1 and t).splitlines()
    assert [line.split(":")[0] for line in lines] == ["shapes.png", "second.png"] and all("detections" in x for x in lines)
    assert len(_wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#gallery img")) >= 2
                     and d.find_elements(By.CSS_SELECTOR, "#gallery img"))) >= 2
    browser.save_screenshot(str(server["tmp"] / "app_batch.png"))

    # nothing came from anywhere but the app: every http(s) request went to 127.0.0.1:<port>
    hosts = set()
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if url.startswith(("http://", "https://", "ws://", "wss://")):
                hosts.add(url.split("/")[2])
    assert hosts == {f"127.0.0.1:{server['port']}"}, hosts
    with Image.open(shot) as im:
        assert im.size[0] >= 1000 and np.asarray(im.convert("L")).std() > 10  # a page was drawn, not a blank
    assert "Traceback" not in server["log"].read_text()
    keep = os.environ.get("VISIONTF_KEEP_SCREENSHOTS")  # a folder to look at them in (the tmp dirs are removed)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for name in ("app_one_image.png", "app_batch.png"):
            shutil.copy(server["tmp"] / name, Path(keep) / name)
