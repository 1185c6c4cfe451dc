"""ResNet-vd's and HGNetv2's ImageNet files: a fitting file loads whole, another layout or width is refused in one line."""
from __future__ import annotations

import pytest
import torch

from visiontf.io.weights import WeightsError
from visiontf.models.backbones.build import build_backbone


@pytest.mark.parametrize(("name", "target"), [("resnet18vd", "R18vd"), ("hgnetv2_b0", "B0")])
def test_imagenet_file_loads_whole_or_is_refused_naming_the_fix(tmp_path, name, target):
    torch.manual_seed(0)
    source = build_backbone(name)
    state = {k: v.clone() for k, v in source.body.state_dict().items()}
    good = tmp_path / "good.pth"
    torch.save(state, good)
    torch.manual_seed(1)
    backbone = build_backbone(name)
    backbone.load_imagenet(good)
    for key, value in backbone.body.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            assert torch.equal(value, state[key]), key

    first = next(k for k, v in state.items() if v.ndim == 4)
    short = tmp_path / "short.pth"
    torch.save({k: v for k, v in state.items() if k != first}, short)
    with pytest.raises(WeightsError, match=rf"short\.pth: .* weights do not fit the {target} backbone: missing 1 key \(e\.g\. {first}\); expected"):
        backbone.load_imagenet(short)

    wide = tmp_path / "wide.pth"
    torch.save({**state, first: torch.zeros(state[first].shape[0] + 1, *state[first].shape[1:])}, wide)
    with pytest.raises(WeightsError, match=rf"wide\.pth: .* weights of another width: {first}"):
        backbone.load_imagenet(wide)
