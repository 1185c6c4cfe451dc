"""PostProcess: scores/labels as the original, boxes scaled to each image, threshold and top-k."""
import math

import pytest
import torch

from visiontf.set_prediction import PostProcess


def case():
    # 2 classes + no object; image 0 is (h=100, w=200), image 1 is (h=50, w=40)
    logits = torch.tensor(
        [
            [[1.0, 3.0, 0.0], [0.0, 0.0, 5.0], [2.0, 1.0, 0.0]],
            [[0.0, 0.0, 0.0], [4.0, 0.0, 0.0], [0.0, 2.0, 1.0]],
        ]
    )
    boxes = torch.tensor(
        [
            [[0.5, 0.5, 0.5, 0.5], [0.25, 0.25, 0.5, 0.5], [0.1, 0.9, 0.2, 0.2]],
            [[0.5, 0.5, 1.0, 1.0], [0.5, 0.25, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0]],
        ]
    )
    return {"pred_logits": logits, "pred_boxes": boxes}, torch.tensor([[100, 200], [50, 40]])


def softmax_score(row, k):
    return math.exp(row[k]) / sum(math.exp(v) for v in row)


def test_hand_case_boxes_scores_labels():
    outputs, sizes = case()
    res = PostProcess()(outputs, sizes)
    assert len(res) == 2
    # image 0, w=200 h=100: cxcywh (0.5,0.5,0.5,0.5) -> xyxy (0.25,0.25,0.75,0.75) -> (50,25,150,75)
    torch.testing.assert_close(
        res[0]["boxes"],
        torch.tensor([[50.0, 25.0, 150.0, 75.0], [0.0, 0.0, 100.0, 50.0], [0.0, 80.0, 40.0, 100.0]]),
    )
    # image 1, w=40 h=50
    torch.testing.assert_close(
        res[1]["boxes"], torch.tensor([[0.0, 0.0, 40.0, 50.0], [10.0, 0.0, 30.0, 25.0], [0.0, 0.0, 0.0, 0.0]])
    )
    assert res[0]["labels"].tolist() == [1, 0, 0]  # "no object" (last) is never a label
    assert res[1]["labels"].tolist() == [0, 0, 1]
    expected = [softmax_score([1, 3, 0], 1), softmax_score([0, 0, 5], 0), softmax_score([2, 1, 0], 0)]
    torch.testing.assert_close(res[0]["scores"], torch.tensor(expected))
    assert res[0]["labels"].dtype == torch.int64 and res[0]["scores"].dtype == torch.float32


def test_threshold_and_top_k():
    outputs, sizes = case()
    pp = PostProcess()
    full = pp(outputs, sizes)
    kept = pp(outputs, sizes, score_threshold=0.5)
    for f, k in zip(full, kept):
        mask = f["scores"] > 0.5
        assert torch.equal(k["scores"], f["scores"][mask]) and torch.equal(k["boxes"], f["boxes"][mask])
    top = pp(outputs, sizes, top_k=2)
    for f, t in zip(full, top):
        assert len(t["scores"]) == 2
        assert torch.equal(t["scores"], f["scores"].sort(descending=True).values[:2])
    both = pp(outputs, sizes, score_threshold=0.5, top_k=1)
    assert [len(r["scores"]) for r in both] == [1, 1]


def test_bf16_outputs_and_list_sizes():
    outputs, sizes = case()
    res = PostProcess()({k: v.to(torch.bfloat16) for k, v in outputs.items()}, sizes.tolist())
    assert res[0]["boxes"].dtype == torch.float32
    torch.testing.assert_close(res[0]["boxes"][0], torch.tensor([50.0, 25.0, 150.0, 75.0]))


def test_bad_target_sizes():
    outputs, sizes = case()
    with pytest.raises(ValueError, match=r"\(B, 2\)"):
        PostProcess()(outputs, sizes[:, :1])
    with pytest.raises(ValueError, match="2 predictions"):
        PostProcess()(outputs, sizes[:1])
