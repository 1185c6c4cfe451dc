"""A mistyped model keyword (a config's ``model_kwargs``, or ``create_model``'s keywords) is one line that names the
keyword, the closest name the model takes and every name it takes: the section names for the families built from
sections, the constructor's own keywords for the others."""
import pytest

from visiontf.models import ModelArgumentError, create_model


@pytest.mark.parametrize(("name", "typo", "meant", "listed"), [
    ("dino_tiny", "arhc", "the section 'arch'", "Its sections: backbone, arch, dino, postprocess"),
    ("detr_tiny", "backbon", "the section 'backbone'", "Its sections: backbone, arch"),
    ("vit_tiny_patch16_224", "dept", "'depth'", "It takes: attn_drop_rate, depth,"),
    ("ipt_tiny", "tile", "'tile_size'", "tile_size"),
])
def test_a_typo_names_the_closest_keyword_and_all_of_them(name, typo, meant, listed):
    with pytest.raises(ModelArgumentError) as caught:
        create_model(name, **{typo: {"x": 1}})
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{name}: ")
    assert f"did you mean {meant}?" in message and listed in message and repr(typo) in message


def test_a_keyword_far_from_every_name_lists_them_without_a_guess():
    with pytest.raises(ModelArgumentError) as caught:
        create_model("rtdetr_tiny", zzz=1)
    message = str(caught.value)
    assert "did you mean" not in message
    assert "It takes: " in message and "backbone" in message and "decoder" in message


def test_a_sections_family_refusing_a_keyword_that_is_not_the_callers_keeps_the_original_error():
    # a wrong key inside a section is the section's own error (it names the section and its fields)
    with pytest.raises(ModelArgumentError, match=r"arch: unknown key\(s\) \['hiden_dim'\]; the arch section"):
        create_model("detr_tiny", arch={"hiden_dim": 8})


def test_setr_unknown_keyword_is_one_line_too():
    with pytest.raises(ModelArgumentError, match=r"setr_naive_vit_tiny_patch16: .*unknown keyword\(s\) \['encodr'\]"):
        create_model("setr_naive_vit_tiny_patch16", encodr={})
