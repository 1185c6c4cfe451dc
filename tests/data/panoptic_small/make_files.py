"""Write the fixed panoptic ground truth and predictions of ``tests/test_panoptic_quality.py`` (deterministic).

    python tests/data/panoptic_small/make_files.py

Three 40 x 50 images with things and stuff, a crowd region, unlabelled (void) pixels, predictions that
match (IoU above and below 0.5), miss, fall on void or on the crowd, and confuse categories. The
numbers the test expects are panopticapi's own ``pq_compute`` on these files (see the test).
"""
import json
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
CATEGORIES = [{"id": 1, "name": "person", "isthing": 1}, {"id": 2, "name": "car", "isthing": 1},
              {"id": 7, "name": "sky", "isthing": 0}, {"id": 9, "name": "road", "isthing": 0}]


def _rgb(ids):
    return np.stack([ids % 256, ids // 256 % 256, ids // 65536], -1).astype(np.uint8)


def _save(folder, name, ids, segments, image_id, gt):
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(_rgb(ids)).save(folder / name)
    info = []
    for seg_id, cat, crowd in segments:
        s = {"id": seg_id, "category_id": cat}
        if gt:
            ys, xs = np.nonzero(ids == seg_id)
            s.update(iscrowd=crowd, area=int((ids == seg_id).sum()),
                     bbox=[int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)])
        info.append(s)
    return {"image_id": image_id, "file_name": name, "segments_info": info}


def main():
    gt_ann, pred_ann, images = [], [], []
    # image 1: sky / road, two persons, a car; prediction good on most, splits the road
    g = np.full((40, 50), 7 + 0, dtype=np.int64)
    g[:] = 100
    g[20:] = 101
    g[5:15, 5:15] = 1
    g[22:35, 30:45] = 2
    g[25:38, 2:12] = 3
    g[0:2, :] = 0  # void strip
    p = np.full((40, 50), 200, dtype=np.int64)
    p[18:] = 201
    p[18:, 25:] = 202  # road split in two
    p[5:15, 4:16] = 11
    p[23:35, 30:44] = 12
    p[25:30, 2:12] = 13  # half a person: IoU below 0.5
    p[0:2, 40:50] = 14   # a car on void only: ignored
    gt_ann.append(_save(HERE / "gt", "img1.png", g, [(100, 7, 0), (101, 9, 0), (1, 1, 0), (2, 2, 0), (3, 1, 0)], 1, True))
    pred_ann.append(_save(HERE / "pred", "img1.png", p, [(200, 7, 0), (201, 9, 0), (202, 9, 0), (11, 1, 0), (12, 2, 0),
                                                          (13, 1, 0), (14, 2, 0)], 1, False))
    # image 2: a crowd of persons and a person; predictions on the crowd are not false positives
    g = np.full((40, 50), 50, dtype=np.int64)
    g[10:30, 10:40] = 5   # crowd
    g[32:39, 1:9] = 6
    p = np.full((40, 50), 60, dtype=np.int64)
    p[12:28, 12:25] = 61  # person on the crowd
    p[12:28, 26:38] = 62  # car on the crowd: a false positive (another category)
    p[32:39, 1:9] = 63    # exact person
    gt_ann.append(_save(HERE / "gt", "img2.png", g, [(50, 7, 0), (5, 1, 1), (6, 1, 0)], 2, True))
    pred_ann.append(_save(HERE / "pred", "img2.png", p, [(60, 9, 0), (61, 1, 0), (62, 2, 0), (63, 1, 0)], 2, False))
    # image 3: only road, predicted as sky (category confusion), plus unlabelled prediction pixels (id 0)
    g = np.full((40, 50), 9, dtype=np.int64)
    p = np.full((40, 50), 70, dtype=np.int64)
    p[:, :5] = 0
    gt_ann.append(_save(HERE / "gt", "img3.png", g, [(9, 9, 0)], 3, True))
    pred_ann.append(_save(HERE / "pred", "img3.png", p, [(70, 7, 0)], 3, False))
    for i in (1, 2, 3):
        images.append({"id": i, "file_name": f"img{i}.jpg", "width": 50, "height": 40})
    (HERE / "gt.json").write_text(json.dumps({"images": images, "annotations": gt_ann, "categories": CATEGORIES}, indent=1))
    (HERE / "pred.json").write_text(json.dumps({"annotations": pred_ann}, indent=1))


if __name__ == "__main__":
    main()
