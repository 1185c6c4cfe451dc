"""A config that builds on base files (base_config:): the chain of files, its plain merge, and the mistakes."""
from pathlib import Path

import pytest

from visiontf.core.config_checks import ConfigError
from visiontf.core.config_files import config_chain, read_config


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_bases_resolve_against_the_referring_files_folder_and_come_first(tmp_path):
    _write(tmp_path / "_base" / "a.yaml", "trainer: {max_epochs: 72, precision: 32-true}\n")
    _write(tmp_path / "_base" / "b.yaml", "base_config: a.yaml\ntrainer: {precision: 16-mixed}\n")
    variant = _write(tmp_path / "v.yaml", "base_config: [_base/b.yaml]\ntrainer: {max_epochs: 120}\n")
    assert config_chain(variant) == [tmp_path / "_base" / "a.yaml", tmp_path / "_base" / "b.yaml", variant]
    assert read_config(variant) == {"trainer": {"max_epochs": 120, "precision": "16-mixed"}}


def test_the_merge_keeps_the_bases_keys_replaces_lists_and_drops_another_classs_arguments(tmp_path):
    _write(tmp_path / "base.yaml", "model:\n  class_path: A\n  init_args: {lr: 1.0, groups: [x, y], deep: {p: 1, q: 2}}\n"
                                   "data:\n  class_path: D\n  init_args: {root: r}\n")
    variant = _write(tmp_path / "v.yaml", "base_config: base.yaml\nmodel:\n  init_args: {groups: [z], deep: {q: 3}}\n"
                                          "data:\n  class_path: E\n  init_args: {size: 4}\n")
    assert read_config(variant) == {"model": {"class_path": "A", "init_args": {"lr": 1.0, "groups": ["z"], "deep": {"p": 1, "q": 3}}},
                                    "data": {"class_path": "E", "init_args": {"size": 4}}}


def test_a_config_without_bases_reads_as_it_is(tmp_path):
    plain = _write(tmp_path / "plain.yaml", "seed_everything: 3\n")
    assert config_chain(plain) == [plain] and read_config(plain) == {"seed_everything": 3}


@pytest.mark.parametrize("text, words", [
    ("base_config: missing.yaml\n", "missing.yaml: no such file"),
    ("base_config: {a: 1}\n", "takes a path or a list of paths"),
    ("base_config: v.yaml\n", "lead back to itself"),
    # 317 bytes of anchors and aliases that stand for 10 ** 8 strings once a reader copies them out
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefg", "bcdefgh")), "anchors and aliases expand"),
])
def test_mistakes_are_one_line_naming_the_file(tmp_path, text, words):
    variant = _write(tmp_path / "v.yaml", text)
    with pytest.raises(ConfigError, match=words) as e:
        read_config(variant)
    assert str(variant) in str(e.value) and "\n" not in str(e.value)


def test_the_tools_put_the_bases_before_the_variant_on_the_command_line(tmp_path):
    from visiontf.cli.train import with_base_configs

    base = _write(tmp_path / "_base" / "a.yaml", "seed_everything: 1\n")
    variant = _write(tmp_path / "v.yaml", "base_config: _base/a.yaml\n")
    argv = ["fit", f"--config={variant}", "--trainer.max_epochs", "3"]
    assert with_base_configs(argv) == ["fit", "--config", str(base), f"--config={variant}", "--trainer.max_epochs", "3"]
    assert with_base_configs(["fit", "-c", str(base)]) == ["fit", "-c", str(base)]


def test_readers_without_the_parser_see_the_bases_values(tmp_path):
    """``--ckpt_path last`` of tools/predict.py finds the run folder a variant inherits from its base."""
    from visiontf.tasks.checkpoints import config_checkpoint_dir, run_checkpoint_dir

    _write(tmp_path / "_base" / "a.yaml", "trainer: {default_root_dir: outputs/shared}\n")
    variant = _write(tmp_path / "v.yaml", "base_config: _base/a.yaml\nmodel: {init_args: {lr: 0.1}}\n")
    assert config_checkpoint_dir(variant) == run_checkpoint_dir("outputs/shared", None)
